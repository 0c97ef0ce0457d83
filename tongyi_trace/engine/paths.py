"""Where the engine lives: the kvtrace cache folder, the engine's venv, and one-line log tails."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The kvtrace cache folder: $KVTRACE_CACHE_DIR or ~/.cache/kvtrace."""
    env = os.environ.get("KVTRACE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kvtrace"


def engine_dir() -> Path:
    """Folder holding the engine's venv, model config, state and run folders."""
    return cache_dir() / "engine"


def venv_dir() -> Path:
    """The engine's dedicated virtual environment."""
    return engine_dir() / "venv"


def venv_python() -> Path:
    """The engine venv's Python interpreter."""
    return venv_dir() / "bin" / "python"


def repo_root() -> Path:
    """The kvtrace source tree (holding pyproject.toml) that is installed into the engine."""
    return Path(__file__).resolve().parent.parent.parent


def tail_text(path: Path, num_lines: int = 8) -> str:
    """The last NUM_LINES non-empty lines of PATH joined with ' | ' (for one-line errors)."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines[-num_lines:]) or "(empty log)"
