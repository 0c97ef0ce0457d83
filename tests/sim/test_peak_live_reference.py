"""The peak live set has one reference, queries/live_set.sql (the live_set analysis); the simulator's numpy
path (sim/capacity.peak_live_blocks, behind the `L` capacity unit) is held to it on real traces."""

from __future__ import annotations

from pathlib import Path

from tongyi_trace.analysis.runner import run_analyses
from tongyi_trace.run import open_run
from tongyi_trace.sim.capacity import peak_live_blocks
from tongyi_trace.sim.stream import next_request_of_refs
from tongyi_trace.sim.sweep import prepare_stream
from tongyi_trace.trace.ingest import ingest_trace


def _both(run_dir: Path) -> tuple[int, int]:
    run = open_run(run_dir)
    sql = run_analyses(run, only="live_set", write=False).results["live_set"].headline["peak_live_blocks"]
    s = prepare_stream(run.tables(), None)
    return int(sql), int(peak_live_blocks(s.req_off, next_request_of_refs(s.req_off, s.blk, s.num_ids)))


def test_tiny_trace_by_hand(tiny_bailian_path: Path, tmp_path: Path) -> None:
    ingest_trace(tiny_bailian_path, tmp_path / "run")
    assert _both(tmp_path / "run") == (5, 5)  # tests/analysis/test_golden_tiny.py: peak 5 at t = 20 s


def test_mooncake_conversation(mooncake_conversation_run: Path) -> None:
    sql, numpy_path = _both(mooncake_conversation_run)
    assert sql > 100
    assert numpy_path == sql
