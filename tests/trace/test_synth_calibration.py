"""The synthetic profiles land in the paper's ranges (issue 3, "Correctness and calibration"), measured
through the real ingest and analyses. Ranges: to-C ideal hit 0.55-0.65, >= 75% of reuses within
10 min, P90 block lifespan 400-900 s; to-B ideal hit 0.50-0.58, >= 90% of hits from single-turn
requests, P99 lifespan <= 200 s; diagonal share of the user heatmap >= 0.9 on both. A quarter of the
default size (10,750 requests over the same 2 h: the user population scales with the requests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tongyi_trace.analysis.runner import run_analyses
from tongyi_trace.run import RunDir
from tongyi_trace.trace.ingest import ingest_trace
from tongyi_trace.trace.synth import synth_to_file

ONLY = ["hit_ratio", "request_mix", "turn_hits", "user_heatmap", "reuse_time", "lifespan"]


def _headlines(profile: str, seed: int, tmp: Path) -> dict[str, dict[str, Any]]:
    trace = tmp / f"{profile}.jsonl"
    synth_to_file(profile, seed, trace, scale=0.25)
    ingest_trace(trace, tmp / "run")
    report = run_analyses(RunDir(tmp / "run"), only=ONLY)
    return {name: res.headline for name, res in report.results.items()}


@pytest.mark.slow
def test_to_c_profile_lands_in_trace_a_ranges(tmp_path: Path) -> None:
    h = _headlines("to-c", 1, tmp_path)
    assert 0.55 <= h["hit_ratio"]["hit_ratio"] <= 0.65
    assert h["reuse_time"]["share_within_600s"] >= 0.75
    assert 400 <= h["lifespan"]["p90_s"] <= 900
    assert h["user_heatmap"]["key_kind"] == "user" and h["user_heatmap"]["diagonal_share"] >= 0.9
    # turn counts (Fig 9): p50 1, p90 ~5; hits come mostly from multi-turn requests (Fig 5)
    assert h["request_mix"]["turn_p50"] == 1 and 4 <= h["request_mix"]["turn_p90"] <= 6
    assert h["turn_hits"]["multi_turn_hit_share"] > 0.5


@pytest.mark.slow
def test_to_b_profile_lands_in_trace_b_ranges(tmp_path: Path) -> None:
    h = _headlines("to-b", 1, tmp_path)
    assert 0.50 <= h["hit_ratio"]["hit_ratio"] <= 0.58
    assert h["turn_hits"]["single_turn_hit_share"] >= 0.9
    assert h["lifespan"]["p99_s"] <= 200
    assert h["user_heatmap"]["key_kind"] == "user" and h["user_heatmap"]["diagonal_share"] >= 0.9
    assert h["request_mix"]["multi_turn_share"] < 0.001
