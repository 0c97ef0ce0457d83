"""Atomic file writes and strict JSON values, standard library only (the vLLM plugin's environment
imports the policy file module, which uses this; so does every run-folder writer via tongyi_trace.run)."""

from __future__ import annotations

import json
import math
import os
import secrets
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePath
from typing import Any

from tongyi_trace.errors import InputError


def temp_path(path: Path) -> Path:
    """A hidden temporary name beside PATH, unique across processes and threads, ending in PATH's suffix
    (writers that choose the format by suffix still work)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.{secrets.token_hex(4)}"
                          f".tmp{path.suffix}")


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a unique temporary path beside PATH; on success it replaces PATH atomically, else it is removed."""
    tmp = temp_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise InputError(f"{path}: cannot write ({e.strerror or e}); check the path and free space") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    commit_point(path)


_writes = [0]  # committed writes of this process (the crash hook's count)


def commit_point(path: Path) -> None:
    """Called after each committed write (an atomic rename, a step of an artifact set's commit). Test hook,
    off unless set: KVTRACE_WRITE_LOG=FILE appends PATH to FILE; KVTRACE_CRASH_AFTER_WRITES=N kills this
    process with SIGKILL right after its N-th committed write (tests/hardening/test_crash.py)."""
    log = os.environ.get("KVTRACE_WRITE_LOG")
    crash = os.environ.get("KVTRACE_CRASH_AFTER_WRITES")
    if not log and not crash:
        return
    _writes[0] += 1
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{_writes[0]}\t{path}\n")
    if crash and _writes[0] == int(crash):
        os.kill(os.getpid(), signal.SIGKILL)


def atomic_write_text(path: Path, text: str) -> None:
    """Write TEXT to PATH atomically (unique temp file + rename): readers see the old or the new file."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def json_default(o: Any) -> Any:
    """The `default` of json.dumps for kvtrace's documents: numpy scalars as plain numbers, paths as text;
    anything else is a TypeError (never silently turned into a string)."""
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, PurePath):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def finite(o: Any) -> Any:
    """O with NaN and infinities as None (strict JSON), recursively; numpy scalars as plain numbers."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: finite(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [finite(v) for v in o]
    if hasattr(o, "item") and not isinstance(o, str | bytes):
        return finite(o.item())
    return o


def json_text(obj: Any) -> str:
    """OBJ as indented, strictly valid JSON: NaN and infinities become null, numpy scalars plain numbers."""
    return json.dumps(finite(obj), indent=2, allow_nan=False, default=json_default) + "\n"
