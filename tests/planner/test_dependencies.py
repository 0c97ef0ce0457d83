"""Runtime imports against the declared dependencies: statically (every third-party module the package imports
is a dependency, a dependency's dependency or a named optional part), and for real (slow): a fresh venv
without extras installs the package with pip and runs synth -> ingest -> analyze -> fit -> simulate."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Modules that are not runtime dependencies, with the reason they may be imported anyway.
OPTIONAL = {
    "ray": "extra 'ray' (--executor ray), imported only when asked for",
    "vllm": "the plugin runs inside the vLLM engine's own environment",
    "playwright": "the report's browser check (dev extra), imported only there",
    "llvmlite": "installed with numba",
    "markupsafe": "installed with jinja2",
}
DIST_OF = {"yaml": "pyyaml"}  # import name -> distribution, where they differ


def _third_party_imports() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in (REPO / "tongyi_trace").rglob("*.py"):
        for n in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in n.names] if isinstance(n, ast.Import) else
                     [n.module] if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module else [])
            for m in names:
                top = m.split(".")[0]
                if top not in sys.stdlib_module_names and top != "tongyi_trace":
                    out.setdefault(top, set()).add(str(f.relative_to(REPO)))
    return out


def _declared() -> set[str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in deps}


def test_every_runtime_import_is_declared() -> None:
    declared = _declared()
    imports = _third_party_imports()
    assert "orjson" in imports and "orjson" in declared  # the reader's JSON decoder
    missing = {m: sorted(files) for m, files in imports.items()
               if DIST_OF.get(m, m).lower() not in declared and m not in OPTIONAL}
    assert not missing, f"imported but not in [project] dependencies: {missing}"


@pytest.mark.slow
@pytest.mark.full
def test_fresh_venv_without_extras_runs_the_pipeline(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    pip = subprocess.run([str(py), "-m", "pip", "install", "--quiet", str(REPO)], capture_output=True, text=True,
                         check=False)
    if pip.returncode != 0 and ("NewConnectionError" in pip.stderr or "No matching distribution" in pip.stderr):
        pytest.skip(f"no package index reachable for the fresh venv: {pip.stderr.strip().splitlines()[-1]}")
    assert pip.returncode == 0, pip.stderr[-3000:]
    kv = str(env_dir / "bin" / "kvtrace")
    trace, run = tmp_path / "t.jsonl", tmp_path / "run"
    for args in (["synth", "--profile", "to-c", "--seed", "1", "--requests", "300", "--duration", "600",
                  "-o", str(trace), "-q"],
                 ["ingest", str(trace), "-o", str(run), "-q"],
                 ["analyze", str(run), "-q"],
                 ["fit", str(run), "-q", "-c", "5%"],
                 ["simulate", str(run), "-p", "lru,wa", "-c", "5%,1GiB", "--params", str(run / "fit" / "policy.json"),
                  "-q", "-j", "1"]):
        proc = subprocess.run([kv, *args], capture_output=True, text=True, check=False, cwd=tmp_path)
        assert proc.returncode == 0, f"kvtrace {args[0]}: {proc.stderr[-3000:]}"
    assert (run / "sim" / "results.parquet").is_file() and (run / "analysis").is_dir()
