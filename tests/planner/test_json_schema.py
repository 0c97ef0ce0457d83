"""Every command's --json output is one JSON object whose first key is `schema`, with absolute paths; -q prints
nothing on stdout (docs/artifacts/cli-json.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tongyi_trace.cli import app
from tongyi_trace.replay.standin import StandInState, serve

RUNNER = CliRunner()


@pytest.fixture(scope="module")
def here(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh folder as the current directory, so that relative paths in commands are relative to it."""
    d = tmp_path_factory.mktemp("json")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(d)
        yield d


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A stand-in OpenAI-compatible endpoint (NOT vLLM)."""
    state = StandInState()
    httpd = serve(state)
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    state.stop.set()
    httpd.shutdown()
    httpd.server_close()


def _json(*args: str) -> dict[str, object]:
    res = RUNNER.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, f"kvtrace {' '.join(args)}: {res.output[-2000:]}"
    doc = json.loads(res.stdout)
    assert isinstance(doc, dict) and next(iter(doc)) == "schema", args
    assert str(doc["schema"]).startswith("kvtrace.") and doc["schema"] != "kvtrace.output/1", args
    return doc


def _quiet(*args: str) -> None:
    res = RUNNER.invoke(app, [*args, "-q"])
    assert res.exit_code == 0, f"kvtrace {' '.join(args)} -q: {res.output[-2000:]}"
    assert res.stdout == "", f"kvtrace {' '.join(args)} -q printed {res.stdout[:300]!r}"


def test_every_command_json_has_schema_and_quiet_is_quiet(here: Path, server: str) -> None:
    doc = _json("synth", "--profile", "to-c", "--seed", "1", "--requests", "200", "--duration", "600",
                "-o", "t.jsonl")
    assert doc["schema"] == "kvtrace.synth-output/1" and doc["path"] == str(here / "t.jsonl")
    doc = _json("ingest", "t.jsonl", "-o", "run")
    assert doc["schema"] == "kvtrace.ingest-output/1" and doc["run_dir"] == str(here / "run")
    _quiet("ingest", "t.jsonl", "-o", "run2")
    assert _json("export", "run", "-o", "t.parquet")["path"] == str(here / "t.parquet")
    doc = _json("analyze", "run", "--only", "hit_ratio")
    assert doc["schema"] == "kvtrace.analysis/1" and doc["run"] == str(here / "run")
    _quiet("analyze", "run", "--only", "hit_ratio")
    doc = _json("fit", "run", "-c", "5%", "-j", "1")
    assert doc["schema"] == "kvtrace.fit-output/1" and doc["policy"] == str(here / "run" / "fit" / "policy.json")
    _quiet("fit", "run", "-c", "none")
    doc = _json("simulate", "run", "-p", "lru,s3fifo", "-c", "5%,1GiB", "-j", "1")
    assert doc["schema"] == "kvtrace.simulate-output/1"
    rec = doc["recommendation"]
    assert isinstance(rec, dict) and rec["schema"] == "kvtrace.recommendation/1"
    _quiet("simulate", "run", "-p", "lru", "-c", "5%", "-j", "1")
    assert _json("simulate", "--list-policies")["schema"] == "kvtrace.policies/1"
    doc = _json("report", "run")
    assert doc["report"] == str(here / "run" / "report.html")
    _quiet("report", "run")
    doc = _json("replay", "run", "--server", server, "--name", "a", "--speedup", "1000", "--max-output", "4")
    assert doc["schema"] == "kvtrace.replay/1"
    _quiet("replay", "run", "--server", server, "--name", "b", "--speedup", "1000", "--max-output", "4")
    assert _json("compare", "run/replay/a", "run/replay/b")["schema"] == "kvtrace.compare/1"
    _quiet("compare", "run/replay/a", "run/replay/b")
    res = RUNNER.invoke(app, ["engine", "status", "--name", "pytest-never-started", "--json"])
    assert res.exit_code == 1  # not running: the same exit code as the text form
    assert next(iter(json.loads(res.stdout).items())) == ("schema", "kvtrace.engine-status/1")
