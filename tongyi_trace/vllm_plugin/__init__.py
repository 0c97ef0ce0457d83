"""kvtrace's vLLM plugin: the workload-aware (WA) eviction policy of paper section 4.2 inside vLLM.

vLLM loads `register` (entry point `kvtrace_wa` in group `vllm.general_plugins`) in each of its
processes. It does nothing unless the server runs with

    KVTRACE_POLICY=/path/policy.json     a kvtrace.policy/1 file written by `kvtrace fit`
    KVTRACE_EVICTION=wa|lru|fifo|s3fifo|fitted  optional (default fitted; policy.names.EVICTION_MODES); baselines run
                                         through the same code, fitted = the policy file's choice for the cache
    KVTRACE_STATS_DIR=/folder            optional (default: the policy's folder): plugin_stats.json
    KVTRACE_TIME_SCALE=x                 optional (default 1): trace seconds per wall second of replay
    KVTRACE_WA_USE_LIFE=1, KVTRACE_WA_CONDITIONAL=0, KVTRACE_WA_USE_OFFSET=1   WA switches
    KVTRACE_GUARD=1 (the default; 0: off), KVTRACE_GUARD_MARGIN, KVTRACE_GUARD_WINDOW_S, KVTRACE_REFIT_S,
    KVTRACE_REFIT_WINDOW_S, KVTRACE_SAMPLE_RATE   the shadow-LRU guard and the online refit (docs/guard.md)

and then replaces the eviction order of vLLM's free-block queue (see queue.py) in the process that
holds the KV cache. On a vLLM version other than SUPPORTED_VLLM, or a policy file it cannot read, it
logs one error and leaves vLLM's LRU untouched. Importing this package does not import vLLM.
"""

from __future__ import annotations

import logging
import os

SUPPORTED_VLLM = "0.32.0"
_REPORTED_ENV = "KVTRACE_PLUGIN_REPORTED"  # set after logging once; child processes inherit it


def _logger() -> logging.Logger:
    """The plugin's logger: its own stderr handler, as vLLM configures its logging after loading plugins."""
    log = logging.getLogger("kvtrace.vllm_plugin")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [kvtrace pid=%(process)d] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


def _report_once(level: int, message: str) -> None:
    """Log MESSAGE in the first vLLM process only (the API server; engine processes inherit the mark)."""
    if os.environ.get(_REPORTED_ENV):
        return
    os.environ[_REPORTED_ENV] = "1"
    _logger().log(level, message)


def register() -> None:
    """vLLM general-plugin entry point: install the kvtrace eviction order when configured."""
    policy_path = os.environ.get("KVTRACE_POLICY")
    if not policy_path:
        return
    try:
        import vllm

        version = getattr(vllm, "__version__", "unknown")
        supported = os.environ.get("KVTRACE_SUPPORTED_VLLM", SUPPORTED_VLLM)  # a test hook
        if version != supported:
            _report_once(logging.ERROR,
                         f"kvtrace plugin: vLLM {version} is not the version this plugin was written "
                         f"against ({supported}); eviction stays vLLM's LRU. Install vllm {supported} "
                         f"or a kvtrace release for vLLM {version}.")
            return
        from tongyi_trace.vllm_plugin.config import PluginConfigError, load_config

        try:
            config = load_config(os.environ)
        except PluginConfigError as e:
            _report_once(logging.ERROR, f"kvtrace plugin: {e}; eviction stays vLLM's LRU.")
            return
        from tongyi_trace.vllm_plugin.patch import install

        install(config, _logger())
        _report_once(logging.INFO, f"kvtrace plugin: eviction '{config.policy.mode}' from {config.policy_path} "
                                   f"({len(config.policy.categories)} categories); stats in "
                                   f"{config.stats_dir}")
    except Exception as e:  # never break serving
        _report_once(logging.ERROR, f"kvtrace plugin: not installed ({type(e).__name__}: {e}); "
                                    f"eviction stays vLLM's LRU.")
