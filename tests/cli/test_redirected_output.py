"""Output to a pipe or file (no terminal, no COLUMNS): tables keep their natural width, numbers are never cut
to fit Rich's default 80 columns (a log or `| less` of `kvtrace simulate` showed `0.0…` for hit ratios)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("columns", [None, "60"])
def test_simulate_table_piped(tiny_bailian_path: Path, tmp_path: Path, columns: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    cli = [sys.executable, "-m", "tongyi_trace.cli"]
    run = str(tmp_path / "run")
    subprocess.run([*cli, "ingest", str(tiny_bailian_path), "-o", run, "-q"], env=env, check=True)
    out = subprocess.run([*cli, "simulate", run, "-p", "lru,fifo,lfu,s3fifo,gdsf,oracle", "-c", "1,2,3", "--verbose"],
                         capture_output=True, text=True, env=env, check=True).stdout
    lines = [line for line in out.splitlines() if line.startswith("│ ")]
    rows = [line for line in lines if line.split("│")[1].strip()]  # a cut cell wraps onto lines of its own
    assert len(rows) == 18, out
    if columns is None:  # every cell whole: policy, capacity and a 4-decimal hit ratio on each row
        assert "…" not in out
        assert all(len(r.split("│")[4].strip()) == 6 for r in rows), out
        assert max(len(r) for r in rows) > 80
    else:  # COLUMNS given: Rich's own sizing, the table cut to 60 columns
        assert max(len(r) for r in lines) <= 60
        assert "…" in "".join(rows)
