"""The one-line notice that kvtrace's numba kernels are being compiled (a cold cache: a fresh install, or
edited kernel sources), so that the first run says why it stalls instead of looking hung.

`notify_first_compile(handler)` (the CLI calls it for every command) makes the first COMPILE of a kvtrace
kernel in this process call HANDLER(NOTICE), once; a kernel loaded from numba's cache says nothing (numba
fires its "numba:compile" event only after the cache missed). Standard library only: numba is not imported
here; when nothing has imported it yet, it is watched from the moment something does (a finder on
sys.meta_path that installs the listener right after numba's own import), so a command that never
compiles pays nothing. A local pool's worker that compiles (executor.py: `log_compiles` in each worker)
marks its pool's folder, and the caller, which looks every second while it waits, says the notice
(`worker_compiled`): the same line, once, above its progress bar. COLD_COMPILE_S is
bench/bench_compile.py's total, each kernel counted once.

With KVTRACE_COMPILE_LOG=FILE set, every compile of a kvtrace kernel also appends one JSON line to FILE:
{"kernel": module.name, "cpu_s": its own CPU seconds (this thread's: a shared machine's load does not
count; a kernel it calls that compiles with it counts apart), "wall_s": the same in wall seconds, "pid"}
(bench/bench_compile.py sums them).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

# every kernel compiled once on a cold cache, CPU seconds (bench/bench_compile.py: 44.5 s summed over its
# processes, a policy's loop 2.5-8.3 s: GDSF 8.3, WA 8.0 + 1.8 for its priority, S3-FIFO 4.1; was 157 s with
# WA's loop 109 s, compiled twice side by side, before each hook had one call site in the loop)
COLD_COMPILE_S = 45
NOTICE = f"compiling the simulator (first run only, about {COLD_COMPILE_S} s)"
PACKAGE = "tongyi_trace"
LOG_ENV = "KVTRACE_COMPILE_LOG"
QUIET_ENV = "KVTRACE_NO_COMPILE_NOTICE"  # set (scripts/compile_kernels.sh): no notice, the caller says it once
MARK = "compiling"  # the file a pool's worker creates in the pool's folder when it first compiles a kernel

_lock = threading.Lock()
_state: dict[str, Any] = {"handler": None, "said": False, "listening": False}


def notify_first_compile(handler: Callable[[str], None]) -> None:
    """Call HANDLER(NOTICE) when this process first compiles a kvtrace kernel (at most once a process;
    never with KVTRACE_NO_COMPILE_NOTICE set)."""
    _state["handler"] = None if os.environ.get(QUIET_ENV) else handler
    if _state["handler"] is None and not os.environ.get(LOG_ENV):
        return
    _watch()


def log_compiles(folder: str) -> None:
    """In an executor's worker process (its pool's shared FOLDER): at its first kernel compile, create
    FOLDER/compiling, so that the calling process says the notice (`worker_compiled`; a worker's own line
    would be drawn over by the caller's progress bar); with KVTRACE_COMPILE_LOG set, log its compiles."""
    _state["handler"] = lambda notice: Path(folder, MARK).touch()
    _watch()


def worker_compiled(folder: str) -> None:
    """In the calling process: say the notice (once, as notify_first_compile's HANDLER) when a worker of the
    pool sharing FOLDER has begun compiling."""
    if not _state["said"] and _state["handler"] is not None and Path(folder, MARK).exists():
        _on_compile(PACKAGE)


def _watch() -> None:
    """Listen to numba's compile events now, or from numba's import on."""
    if "numba" in sys.modules:
        _listen()
    elif not any(isinstance(f, _NumbaWatch) for f in sys.meta_path):
        sys.meta_path.insert(0, _NumbaWatch())


def _on_compile(module: str) -> None:
    with _lock:
        if _state["said"] or _state["handler"] is None or not module.startswith(PACKAGE):
            return
        _state["said"] = True
    _state["handler"](NOTICE)


def _listen() -> None:
    """Register the listener on numba's compile events (once a process)."""
    with _lock:
        if _state["listening"]:
            return
        _state["listening"] = True
    from numba.core import event

    log = os.environ.get(LOG_ENV)
    stack = threading.local()

    class _FirstCompile(event.Listener):
        def on_start(self, ev: Any) -> None:
            fn = getattr(ev.data.get("dispatcher"), "py_func", None)
            _on_compile(str(getattr(fn, "__module__", "") or ""))
            if log:
                frames = stack.__dict__.setdefault("frames", [])
                # start (CPU, wall), seconds of the compiles nested in it (CPU, wall)
                frames.append([time.thread_time(), time.perf_counter(), 0.0, 0.0])

        def on_end(self, ev: Any) -> None:
            frames = stack.__dict__.get("frames") if log else None
            if not frames:
                return
            cpu0, wall0, nested_cpu, nested_wall = frames.pop()
            cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
            if frames:
                frames[-1][2] += cpu
                frames[-1][3] += wall
            fn = getattr(ev.data.get("dispatcher"), "py_func", None)
            name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
            if name.startswith(PACKAGE):
                with open(str(log), "a") as f:
                    f.write(json.dumps({"kernel": name, "cpu_s": round(cpu - nested_cpu, 4),
                                        "wall_s": round(wall - nested_wall, 4), "pid": os.getpid()}) + "\n")

    event.register("numba:compile", _FirstCompile())


class _NumbaWatch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the import of numba it hands back numba's own spec, whose loader then
    installs the listener once numba is imported."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "numba":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            _listen()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
