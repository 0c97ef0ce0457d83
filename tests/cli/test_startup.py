"""`kvtrace CMD --help` imports no heavy library (its time is in `make bench`: bench/bench_cli.py), nor do
`engine status` and `engine stop` (they read a state file and ask a server), and the option defaults read
from source without importing equal the imported values."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tongyi_trace.cli import COMMANDS, source_keys, source_value

HEAVY = ("numpy", "polars", "duckdb", "pyarrow", "numba", "plotly", "pydantic", "aiohttp", "rich.console")
PROBE = """
import runpy, sys
sys.argv = ["kvtrace", *{args!r}]
try:
    runpy.run_module("tongyi_trace.cli", run_name="__main__")
except SystemExit as e:
    assert e.code in {codes!r}, e.code
print("heavy imports:", ",".join(m for m in {heavy!r} if m in sys.modules))
"""
CLI_DIR = Path(__file__).resolve().parents[2] / "tongyi_trace" / "cli"


def _invocations() -> list[list[str]]:
    return [["--help"], *([name, "--help"] for name in COMMANDS),
            *(["engine", sub, "--help"] for sub in ("install", "start", "stop", "status"))]


@pytest.mark.parametrize("args", _invocations(), ids=" ".join)
def test_help_imports_no_heavy_library(args: list[str]) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE.format(args=args, heavy=HEAVY, codes=(0, None))],
                         capture_output=True, text=True, check=True)
    assert "Usage:" in out.stdout
    assert out.stdout.splitlines()[-1] == "heavy imports: "


TABLE_LIBRARIES = ("numpy", "polars", "duckdb", "pyarrow", "numba", "scipy", "plotly")


@pytest.mark.parametrize("args", [["engine", "status", "--name", "kvtrace-test-none", "--json"],
                                  ["engine", "stop", "--name", "kvtrace-test-none"]], ids=" ".join)
def test_engine_status_and_stop_import_no_table_library(args: list[str]) -> None:
    """They ran 1.4 s on the imports of the plugin's queue and of the run folder module (polars, pyarrow)."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(args=args, heavy=TABLE_LIBRARIES, codes=(0, 1))],
                         capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "heavy imports: "


def _source_reads() -> list[tuple[str, str, str]]:
    """Every source_value / source_keys call in the CLI modules: (function, module, name)."""
    calls = []
    for path in sorted(CLI_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("source_value", "source_keys"):
                module, name = (ast.literal_eval(a) for a in node.args)
                calls.append((node.func.id, module, name))
    return calls


def test_source_reads_equal_the_imported_values() -> None:
    calls = _source_reads()
    assert {c[1] for c in calls} >= {"fit.tune", "fit.policy_fit", "analysis.runner", "trace.synth", "study",
                                     "replay.prompts", "engine.model", "engine.process"}
    for fn, module, name in calls:
        imported = getattr(importlib.import_module(f"tongyi_trace.{module}"), name)
        if fn == "source_value":
            assert source_value(module, name) == imported, (module, name)
        else:
            assert source_keys(module, name) == list(imported), (module, name)
    assert source_keys("trace.synth", "PROFILE_TABLE") == ["to-c", "to-b", "thinking", "coder"]
    assert source_value("fit.policy_fit", "DEFAULT_LIFE_QUANTILE") == 0.9


def test_source_value_names_a_missing_constant() -> None:
    with pytest.raises(LookupError, match="no top-level assignment to NOPE"):
        source_value("fit.tune", "NOPE")
