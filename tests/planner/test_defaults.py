"""The run's fitted policy is used by default (`simulate -p wa` without --params), and a raw trace is accepted
where a run folder is (ingested once into ./<trace name>.kvtrace)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tongyi_trace.cli import app

RUNNER = CliRunner()


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from tongyi_trace.trace.synth import synth_to_file

    synth_to_file("to-c", 2, tmp_path / "t.jsonl", num_requests=200, duration_s=600)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _ok(*args: str) -> dict[str, object]:
    res = RUNNER.invoke(app, list(args))
    assert res.exit_code == 0, res.output[-2000:]
    return json.loads(res.stdout) if "--json" in args else {}


def test_trace_accepted_and_fitted_policy_by_default(in_tmp: Path) -> None:
    res = RUNNER.invoke(app, ["simulate", "t.jsonl", "-p", "wa", "-c", "5%", "-j", "1"])
    assert res.exit_code == 2 and "run 'kvtrace fit t.kvtrace' first" in res.output  # says how to get one
    run = in_tmp / "t.kvtrace"
    assert (run / "provenance.json").is_file()  # ingested once, from the trace
    fit = _ok("fit", "t.jsonl", "-c", "5%", "-j", "1", "--json")
    assert fit["policy"] == str(run / "fit" / "policy.json")
    doc = _ok("simulate", "t.jsonl", "-p", "lru,wa", "-c", "5%", "-j", "1", "--json")
    summary = doc["summary"]
    assert isinstance(summary, dict)
    assert summary["params_path"] == str(run / "fit" / "policy.json") and summary["run_dir"] == str(run)
    res = RUNNER.invoke(app, ["simulate", str(run), "-p", "wa", "-c", "5%", "-j", "1"])
    assert res.exit_code == 0 and f"fitted policy file: {run / 'fit' / 'policy.json'}" in res.output
    lru_only = _ok("simulate", str(run), "-p", "lru", "-c", "5%", "-j", "1", "--json")["summary"]
    assert isinstance(lru_only, dict) and lru_only["params_path"] is None  # not loaded when no policy needs it
    assert _ok("report", "t.jsonl", "--json")["report"] == str(run / "report.html")
