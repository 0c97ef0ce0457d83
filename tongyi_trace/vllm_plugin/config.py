"""The plugin's settings, read from the server's environment (see the package docstring)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from tongyi_trace.errors import InputError
from tongyi_trace.policy.file import load_policy
from tongyi_trace.policy.guard import GuardSettings
from tongyi_trace.policy.names import EVICTION_MODES
from tongyi_trace.policy.wa_priority import MODELS
from tongyi_trace.vllm_plugin.settings import QueuePolicy


class PluginConfigError(Exception):
    """The environment or the policy file cannot configure the plugin (one line, for the log)."""


@dataclass(frozen=True)
class PluginConfig:
    """Everything `install` needs: the queue policy, where it came from and where stats go."""

    policy: QueuePolicy
    policy_path: Path
    stats_dir: Path


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise PluginConfigError(f"{name}={raw!r} is not a switch; use 1 or 0")


# environment variable -> WA parameter of the guard and the refit (tongyi_trace.sim.policies.wa.WaParams)
GUARD_ENV = {"KVTRACE_GUARD": "guard", "KVTRACE_GUARD_MARGIN": "guard_margin",
             "KVTRACE_GUARD_WINDOW_S": "guard_window_s", "KVTRACE_REFIT_S": "refit_s",
             "KVTRACE_REFIT_WINDOW_S": "window_s", "KVTRACE_SAMPLE_RATE": "sample_rate"}


def plugin_env(policy: Path | None, eviction: str | None, guard: GuardSettings, time_scale: float,
               block_size: int, stats_dir: Path | None) -> dict[str, str]:
    """The KVTRACE_* variables that make a vLLM server run the plugin with these settings: the one writer of
    what `load_config` and `guard_settings` read (engine.start sets them)."""
    env: dict[str, str] = {}
    if policy is not None:
        env["KVTRACE_POLICY"] = str(policy.resolve())
    if eviction is not None:
        env["KVTRACE_EVICTION"] = eviction
    if stats_dir is not None:
        env["KVTRACE_STATS_DIR"] = str(stats_dir)
    env["KVTRACE_TIME_SCALE"] = repr(float(time_scale))
    env["KVTRACE_BLOCK_SIZE"] = str(block_size)
    for var, name in GUARD_ENV.items():
        value = getattr(guard, name)
        env[var] = ("1" if value else "0") if isinstance(value, bool) else repr(float(value))
    return env


def guard_settings(env: Mapping[str, str]) -> GuardSettings:
    """The guard's and the refit's settings from ENV (GUARD_ENV), WA's defaults and validation (the
    simulator's WaParams uses the same GuardSettings; importing it here would load numba into vLLM)."""
    from tongyi_trace.errors import UsageError

    values: dict[str, object] = {}
    for var, name in GUARD_ENV.items():
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        if name == "guard":
            values[name] = _flag(env, var, False)
            continue
        try:
            values[name] = float(raw)
        except ValueError as e:
            raise PluginConfigError(f"{var}={raw!r} is not a number") from e
    settings = GuardSettings(**values)  # type: ignore[arg-type]
    try:
        settings.check()
    except UsageError as e:
        raise PluginConfigError(f"{e} (from the KVTRACE_GUARD* / KVTRACE_REFIT* variables)") from e
    return settings


def load_config(env: Mapping[str, str]) -> PluginConfig:
    """Build the plugin configuration from ENV (KVTRACE_* variables); raise PluginConfigError."""
    path = Path(env["KVTRACE_POLICY"])
    mode = (env.get("KVTRACE_EVICTION") or "fitted").lower()
    if mode not in EVICTION_MODES:
        raise PluginConfigError(f"KVTRACE_EVICTION={mode!r} is not one of {', '.join(EVICTION_MODES)}")
    try:
        params = load_policy(path)
    except InputError as e:
        raise PluginConfigError(f"policy file rejected: {e}") from e
    try:
        scale = float(env.get("KVTRACE_TIME_SCALE") or 1.0)
    except ValueError as e:
        raise PluginConfigError(f"KVTRACE_TIME_SCALE={env.get('KVTRACE_TIME_SCALE')!r} is not a number") from e
    if not scale > 0:
        raise PluginConfigError(f"KVTRACE_TIME_SCALE={scale} must be > 0")

    model = (env.get("KVTRACE_WA_MODEL") or "exp").lower()
    if model not in MODELS:
        raise PluginConfigError(f"KVTRACE_WA_MODEL={model!r} is not one of {', '.join(MODELS)}")
    try:
        life_s = float(env.get("KVTRACE_WA_LIFE_S") or 0.0)
    except ValueError as e:
        raise PluginConfigError(f"KVTRACE_WA_LIFE_S={env.get('KVTRACE_WA_LIFE_S')!r} is not a number") from e
    if not 0.0 <= life_s < float("inf"):
        raise PluginConfigError(f"KVTRACE_WA_LIFE_S={life_s} must be a finite number >= 0")
    leaf = env.get("KVTRACE_LEAF_ONLY")
    raw_bs = env.get("KVTRACE_BLOCK_SIZE") or "16"
    if not raw_bs.isdigit() or int(raw_bs) < 1:
        raise PluginConfigError(f"KVTRACE_BLOCK_SIZE={raw_bs!r} must be a positive number of tokens")
    policy = QueuePolicy(
        mode=mode,
        categories=dict(params.categories),
        default=params.default,
        use_life=_flag(env, "KVTRACE_WA_USE_LIFE", True),
        conditional=_flag(env, "KVTRACE_WA_CONDITIONAL", False),
        use_offset=_flag(env, "KVTRACE_WA_USE_OFFSET", True),
        time_scale=scale,
        model=model,
        life_s=life_s,
        leaf_only=None if leaf in (None, "") else _flag(env, "KVTRACE_LEAF_ONLY", True),
        choices=tuple((c.capacity_blocks * params.block_size, c.policy, dict(c.params)) for c in params.choices),
        block_size=int(raw_bs),
    )
    policy = replace(policy, guard=guard_settings(env))
    stats_dir = Path(env.get("KVTRACE_STATS_DIR") or path.resolve().parent)
    return PluginConfig(policy=policy, policy_path=path, stats_dir=stats_dir)
