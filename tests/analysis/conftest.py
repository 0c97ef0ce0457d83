"""Fixtures of the analysis tests: tiny traces written as JSONL and ingested by the real `ingest_trace`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tongyi_trace.analysis import AnalysisReport, run_analyses
from tongyi_trace.run import RunDir
from tongyi_trace.trace.ingest import ingest_trace

RunFactory = Callable[[list[dict[str, Any]], str], RunDir]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write ROWS as one JSON object a line."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def make_run(tmp_path: Path) -> RunFactory:
    """Build a run folder from trace rows (Bailian or Mooncake fields) through the real ingest."""
    counter = iter(range(1_000_000))

    def make(rows: list[dict[str, Any]], name: str = "t", **ingest_options: Any) -> RunDir:
        i = next(counter)
        trace = write_jsonl(tmp_path / f"{name}{i}.jsonl", rows)
        out = tmp_path / f"{name}{i}.run"
        ingest_trace(trace, out, **ingest_options)
        return RunDir(out)

    return make


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory: pytest.TempPathFactory, tiny_bailian_path: Path) -> AnalysisReport:
    """Every analysis over tests/fixtures/tiny_bailian.jsonl (see tests/fixtures/README.md)."""
    out = tmp_path_factory.mktemp("tiny_run")
    ingest_trace(tiny_bailian_path, out)
    return run_analyses(RunDir(out))
