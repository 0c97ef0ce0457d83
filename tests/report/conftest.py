"""Fixtures of the report tests: a tiny trace whose strings are hostile, run through the real pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tongyi_trace.analysis import run_analyses
from tongyi_trace.run import RunDir, open_run
from tongyi_trace.trace.ingest import ingest_trace

EVIL = "<script>alert(1)</script>"
EVIL_USER = "</script><img src=x onerror=alert(2)>"


@pytest.fixture(scope="session")
def evil_trace(tiny_bailian_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_bailian.jsonl with the type 'search' renamed to EVIL and one user id set to EVIL_USER."""
    out = tmp_path_factory.mktemp("evil_trace") / "evil.jsonl"
    lines = []
    for line in tiny_bailian_path.read_text().splitlines():
        rec = json.loads(line)
        if rec["type"] == "search":
            rec["type"] = EVIL
        if rec.get("user_id") == "u2":
            rec["user_id"] = EVIL_USER
        lines.append(json.dumps(rec))
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.fixture(scope="session")
def evil_run(evil_trace: Path, tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    """EVIL trace ingested and analyzed (every artifact the report reads that exists so far)."""
    out = tmp_path_factory.mktemp("evil_run")
    ingest_trace(evil_trace, out)
    run = open_run(out)
    run_analyses(run)
    return run
