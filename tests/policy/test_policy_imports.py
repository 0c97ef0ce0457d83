"""The policy core (tongyi_trace/policy/) is what the vLLM plugin imports inside the engine: standard
library and numpy only, and nothing of kvtrace above it (docs/architecture.md, "The house")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = ("numba", "llvmlite", "polars", "duckdb", "pyarrow", "plotly", "scipy", "orjson", "typer", "rich")
PACKAGE = Path(__file__).resolve().parents[2] / "tongyi_trace" / "policy"


def test_policy_core_loads_only_the_standard_library_and_numpy(tmp_path: Path) -> None:
    modules = sorted(f"tongyi_trace.policy.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert "tongyi_trace.policy.file" in modules and len(modules) >= 8
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}:\n    importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in sys.modules if '.' not in m or m.startswith('tongyi_trace'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(set(loaded) & set(HEAVY)) == []
    ours = sorted(m for m in loaded if m.startswith("tongyi_trace"))
    ground = {"tongyi_trace", "tongyi_trace.errors", "tongyi_trace.atomic", "tongyi_trace.schemas",
              "tongyi_trace.splitmix"}  # the ground floor's standard-library modules
    assert set(ours) - {*modules, "tongyi_trace.policy", *ground} == set(), ours
