"""The report's policy-gain part: the exported policy against LRU and the best baseline, per capacity."""

from __future__ import annotations

import polars as pl

from tongyi_trace.report.sections import sim
from tongyi_trace.run import RunDir


def _results(rows: list[tuple[str, str, int, float]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=["policy", "capacity", "capacity_blocks", "hit_ratio"], orient="row")


def test_policy_gains_golden() -> None:
    res = _results([
        ("lru", "a", 10, 0.10), ("s3fifo", "a", 10, 0.12), ("fitted", "a", 10, 0.15), ("oracle", "a", 10, 0.30),
        ("oracle-dead", "a", 10, 0.22),
        ("lru", "b", 20, 0.40), ("s3fifo", "b", 20, 0.30), ("fitted", "b", 20, 0.39), ("oracle", "b", 20, 0.40),
    ])
    caps = res.select("capacity", "capacity_blocks").unique(maintain_order=True)
    gains = {g["capacity"]: g for g in sim._policy_gains(res, caps, "fitted")}
    a, b = gains["a"], gains["b"]
    # a: +5 points over LRU, +3 over the best baseline (S3-FIFO), headroom 20 points, a quarter closed
    assert (a["best"], round(100 * a["vs_lru"], 6), round(100 * a["vs_best"], 6)) == ("s3fifo", 5.0, 3.0)
    assert round(a["headroom"], 6) == 0.2 and round(a["closed"], 6) == 0.25
    assert round(a["dead_headroom"], 6) == 0.12  # knowing which blocks die: 12 of the 20 points
    # b: LRU is the best baseline and the exported policy loses 1 point; no gap to close
    assert (b["best"], round(100 * b["vs_lru"], 6)) == ("lru", -1.0) and b["closed"] is None
    assert b["dead_headroom"] is None  # oracle-dead not simulated there


def test_report_says_whether_the_exported_policy_beats_lru(evil_run: RunDir) -> None:
    [section] = sim.build(evil_run)
    assert "gain" in section.tables and "gain" in section.figures
    verdict = section.values["gain_verdict"]
    gains = sim._policy_gains(sim._results(evil_run.path / "sim"),  # type: ignore[arg-type]
                              pl.DataFrame({"capacity": ["2", "4", "8", "inf"], "capacity_blocks": [2, 4, 8, 10]}),
                              "wa")
    if any(g["vs_lru"] < 0 for g in gains):
        assert verdict.startswith("The exported policy (wa) loses to LRU at")
    else:
        assert verdict.endswith("at least as good as LRU at every simulated capacity.")
    assert "orphans" in section.tables  # orphaned references per policy
