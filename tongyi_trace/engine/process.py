"""Supervise engine processes: start, stop and report the CPU vLLM server of `kvtrace engine`.

`start` serves `python -m vllm.entrypoints.openai.api_server` from the engine's venv on a free loopback
port (prefix caching on, `--enable-prompt-tokens-details`, `--num-gpu-blocks-override N` to fix the cache
size), waits for GET /health, and records pid + log in a state folder; `stop` ends exactly that process
group; `status` reports it. Facts: /work/shared/reference/vllm-notes.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from tongyi_trace.atomic import atomic_write_text
from tongyi_trace.engine.install import Log, is_installed, no_log
from tongyi_trace.engine.model import SERVED_MODEL_NAME, write_model_dir
from tongyi_trace.engine.paths import engine_dir, tail_text, venv_dir, venv_python
from tongyi_trace.errors import EngineError, UsageError
from tongyi_trace.policy.guard import GuardSettings
from tongyi_trace.policy.names import EVICTION_MODES

EVICTION_CHOICES = EVICTION_MODES
DEFAULT_ENGINE_NAME = "default"

_LAUNCHED: list[subprocess.Popen[bytes]] = []


@dataclass(frozen=True)
class EngineState:
    """One started engine: written to STATE/engine.json when it starts."""

    name: str
    pid: int
    port: int
    url: str
    log_path: str
    model_dir: str
    served_model_name: str
    num_blocks: int
    block_size: int
    max_model_len: int
    eviction: str | None
    policy: str | None
    started_at: float
    command: list[str]
    stats_dir: str | None = None
    time_scale: float = 1.0
    tokenizer_file: str | None = None  # with --tokenizer: the engine's tokenizer.json (text, chat, /tokenize)


def state_dir(name: str = DEFAULT_ENGINE_NAME) -> Path:
    """Folder of the pid/state file and log of engine NAME."""
    if not name or "/" in name or name.startswith("."):
        raise UsageError(f"engine name {name!r} is not a plain folder name; use e.g. 'default'")
    return engine_dir() / "state" / name


def _state_path(name: str) -> Path:
    return state_dir(name) / "engine.json"


def read_state(name: str = DEFAULT_ENGINE_NAME) -> EngineState | None:
    """The recorded state of engine NAME, or None when none was started."""
    p = _state_path(name)
    if not p.is_file():
        return None
    try:
        return EngineState(**json.loads(p.read_text()))
    except (OSError, json.JSONDecodeError, TypeError) as e:
        raise EngineError(f"{p}: unreadable engine state ({e}); delete it and start again") from e


def local_engine_at(url: str) -> EngineState | None:
    """The running kvtrace engine (any name) serving URL, or None (a remote or foreign server)."""
    root = engine_dir() / "state"
    if not root.is_dir():
        return None
    for d in sorted(root.iterdir()):
        try:
            st = read_state(d.name)
        except (EngineError, UsageError):
            continue
        if st is not None and st.url == url.rstrip("/") and _alive(st):
            return st
    return None


def _alive(st: EngineState) -> bool:
    """True when the recorded pid still runs OUR server (guards against a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{st.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    try:
        stat = Path(f"/proc/{st.pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    except (OSError, IndexError):
        return False
    return b"vllm.entrypoints.openai.api_server" in cmdline and str(st.port).encode() in cmdline


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _check_start_args(num_blocks: int, block_size: int, max_model_len: int,
                      eviction: str | None, policy: Path | None) -> None:
    if block_size <= 0 or block_size % 32:
        raise UsageError(f"--block-size {block_size}: the CPU engine needs a multiple of 32 (e.g. 32)")
    if max_model_len <= 0:
        raise UsageError(f"--max-model-len {max_model_len} must be positive")
    if num_blocks * block_size < max_model_len:
        raise UsageError(f"--num-blocks {num_blocks} x --block-size {block_size} = "
                         f"{num_blocks * block_size} tokens < --max-model-len {max_model_len}: vLLM refuses "
                         "to start; raise --num-blocks or lower --max-model-len")
    if eviction is not None and eviction not in EVICTION_CHOICES:
        raise UsageError(f"--eviction {eviction!r}: choose one of {', '.join(EVICTION_CHOICES)}")
    if eviction in ("wa", "fitted") and policy is None:
        raise UsageError(f"--eviction {eviction} needs --policy POLICY.json (from 'kvtrace fit')")
    if policy is not None and not policy.is_file():
        raise UsageError(f"--policy {policy}: no such file; write one with 'kvtrace fit RUN_DIR -o {policy}'")


def start(num_blocks: int = 512, block_size: int = 32, max_model_len: int = 4096,
          eviction: str | None = None, policy: Path | None = None, name: str = DEFAULT_ENGINE_NAME,
          timeout_s: float = 600.0, port: int | None = None, time_scale: float = 1.0,
          guard: bool | GuardSettings = True, stats_dir: Path | None = None, check_policy: bool = True,
          log: Log = no_log, tokenizer: bool = False) -> EngineState:
    """Start the CPU vLLM server and wait until GET /health answers 200; return its recorded state.

    The plugin's settings: POLICY (a policy file) and EVICTION (a mode), TIME_SCALE, GUARD (the shadow-LRU
    guard and the online refit when it runs WA: on/off with their defaults, or all their settings;
    docs/guard.md), STATS_DIR (default: the engine's state folder). CHECK_POLICY=False hands a policy file
    to the plugin unread (a test of the plugin's own refusal). TOKENIZER: serve with the small local tokenizer
    of engine/tokenizer.py (text prompts, chat, /tokenize) instead of --skip-tokenizer-init (token-id prompts
    only)."""
    _check_start_args(num_blocks, block_size, max_model_len, eviction, policy)
    if not time_scale > 0:
        raise UsageError(f"--time-scale {time_scale} must be > 0 (trace seconds per wall second)")
    guard_settings = guard if isinstance(guard, GuardSettings) else GuardSettings(guard=guard)
    guard_settings.check()
    if policy is not None:
        if check_policy:
            from tongyi_trace.policy.file import load_policy
            load_policy(policy)  # a malformed policy file is refused here, not inside the engine
        if eviction is None:
            eviction = "fitted"
    if not is_installed():
        raise EngineError("the CPU vLLM engine is not installed; run 'kvtrace engine install' "
                          "(about 3.5 GB, a few minutes)")
    old = read_state(name)
    if old is not None and _alive(old):
        raise EngineError(f"engine {name!r} already runs at {old.url} (pid {old.pid}); "
                          f"'kvtrace engine stop --name {name}' first or pick another --name")
    sdir = state_dir(name)
    sdir.mkdir(parents=True, exist_ok=True)
    _state_path(name).unlink(missing_ok=True)
    # An empty working folder: a directory named like an installed package would shadow it.
    run_dir = sdir / "cwd"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir()
    model_dir = write_model_dir(max_model_len, tokenizer=tokenizer)
    port = port or free_port()
    cmd = [str(venv_python()), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(model_dir), "--served-model-name", SERVED_MODEL_NAME,
           "--load-format", "dummy", *([] if tokenizer else ["--skip-tokenizer-init"]),
           "--dtype", "bfloat16", "--enforce-eager",
           "--enable-prefix-caching", "--enable-prompt-tokens-details",
           "--block-size", str(block_size), "--max-model-len", str(max_model_len),
           "--num-gpu-blocks-override", str(num_blocks),
           "--host", "127.0.0.1", "--port", str(port)]
    env = dict(os.environ)
    for k in [k for k in env if k.startswith("KVTRACE_") and k != "KVTRACE_CACHE_DIR"]:
        env.pop(k)
    for k in ("PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(k, None)
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    env["VLLM_SERVER_DEV_MODE"] = "1"  # enables POST /reset_prefix_cache (replay --reset-cache)
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    env["PATH"] = f"{venv_dir() / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    if tokenizer:  # the tokenizer is local: never look it up on the Hugging Face hub
        env["HF_HUB_OFFLINE"] = "1"
    plugin_stats_dir = None
    if eviction is not None:  # the plugin runs: its counters go to STATS_DIR (default STATE)/plugin_stats.json
        from tongyi_trace.vllm_plugin.config import plugin_env

        plugin_stats_dir = stats_dir or sdir
        env.update(plugin_env(policy, eviction, guard_settings, time_scale, block_size, plugin_stats_dir))
        (plugin_stats_dir / "plugin_stats.json").unlink(missing_ok=True)
    log_path = sdir / "engine.log"
    url = f"http://127.0.0.1:{port}"
    with log_path.open("w") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=run_dir, env=env, start_new_session=True)
    _LAUNCHED.append(proc)  # keep the handle: the server outlives this call (no ResourceWarning on GC)
    st = EngineState(name=name, pid=proc.pid, port=port, url=url, log_path=str(log_path),
                     model_dir=str(model_dir), served_model_name=SERVED_MODEL_NAME, num_blocks=num_blocks,
                     block_size=block_size, max_model_len=max_model_len, eviction=eviction,
                     policy=str(policy.resolve()) if policy else None, started_at=time.time(), command=cmd,
                     stats_dir=None if plugin_stats_dir is None else str(plugin_stats_dir),
                     time_scale=float(time_scale),
                     tokenizer_file=str(model_dir / "tokenizer.json") if tokenizer else None)
    atomic_write_text(_state_path(name), json.dumps(asdict(st), indent=2) + "\n")
    log(f"engine start: pid {proc.pid}, waiting for {url}/health (log {log_path})")
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            code = proc.poll()
            if code is not None:
                _state_path(name).unlink(missing_ok=True)
                raise EngineError(f"engine exited with code {code} before it was ready; "
                                  f"log {log_path}: {tail_text(log_path)}")
            if _healthy(url):
                return st
            if time.monotonic() > deadline:
                _kill_group(proc.pid)
                _state_path(name).unlink(missing_ok=True)
                raise EngineError(f"engine not ready after {timeout_s:.0f} s (stopped it); "
                                  f"log {log_path}: {tail_text(log_path)}")
            time.sleep(0.5)
    except KeyboardInterrupt:
        _kill_group(proc.pid)
        _state_path(name).unlink(missing_ok=True)
        raise


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _kill_group(pid: int, grace_s: float = 20.0) -> None:
    """SIGTERM the process group led by PID, then SIGKILL it after GRACE_S."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            break
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


# ------------------------------------------------------------------------------------------ stop/status
def stop(name: str = DEFAULT_ENGINE_NAME) -> EngineState | None:
    """Stop exactly the server recorded for engine NAME (its process group); None when none runs."""
    st = read_state(name)
    if st is None:
        return None
    if _alive(st):
        _kill_group(st.pid)
    for proc in [p for p in _LAUNCHED if p.pid == st.pid]:  # started by this process: reap it
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        _LAUNCHED.remove(proc)
    _state_path(name).unlink(missing_ok=True)
    return st


@dataclass(frozen=True)
class EngineStatus:
    """What `status` reports."""

    name: str
    running: bool
    healthy: bool
    installed: bool
    state: EngineState | None


def status(name: str = DEFAULT_ENGINE_NAME) -> EngineStatus:
    """Whether engine NAME runs and answers /health."""
    st = read_state(name)
    running = st is not None and _alive(st)
    healthy = running and st is not None and _healthy(st.url)
    return EngineStatus(name=name, running=running, healthy=healthy, installed=is_installed(),
                        state=st if running else None)
