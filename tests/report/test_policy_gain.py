"""The report's policy-gain part: the exported policy against LRU and the best baseline, per capacity."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tongyi_trace.fit.policy_fit import fit_policy
from tongyi_trace.report.sections import sim
from tongyi_trace.run import RunDir, open_run
from tongyi_trace.sim.sweep import SimulateOptions, simulate_run
from tongyi_trace.trace.ingest import ingest_trace


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
    # a loss with an interval counts when all of it is below 0 (the Recommendation's rule)
    if any((g["vs_lru_interval_pp"][1] < 0) if g.get("vs_lru_interval_pp") else g["vs_lru"] < 0 for g in gains):
        assert verdict.startswith("The exported policy (wa) loses to LRU at")
    else:
        assert verdict.endswith("at least as good as LRU at every simulated capacity.")
    assert "orphans" in section.tables  # orphaned references per policy


def test_headline_gives_the_policy_files_gain_beside_was(tiny_bailian_path: Path,
                                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    """The headline's first rows quote the paper's WA; the tool's answer is the fitted choice: its gain over
    the best baseline at the smallest and largest capacity follows them, as the gain table computes it."""
    out = tmp_path_factory.mktemp("fitted_run")
    ingest_trace(tiny_bailian_path, out)
    fit_policy(out, out / "fit" / "policy.json", min_samples=2, holdout=0.0, capacities="2,4")
    simulate_run(out, SimulateOptions(policies="lru,s3fifo,wa,fitted", capacities="2,4",
                                      params_path=out / "fit" / "policy.json", jobs=1))
    [section] = sim.build(open_run(out))
    got = {h.label: h.value for h in section.headline}
    results = sim._results(out / "sim")
    assert results is not None
    caps = results.select("capacity", "capacity_blocks").unique(maintain_order=True).sort("capacity_blocks")
    gains = sim._policy_gains(results, caps, "fitted")
    assert list(got)[:2] == ["WA - best baseline, smallest capacity (2)", "WA - best baseline, largest capacity (4)"]
    assert got["fitted (the policy file's choice) - best baseline, smallest capacity (2)"] == \
        f"{100 * gains[0]['vs_best']:+.2f} points"
    assert got["fitted (the policy file's choice) - best baseline, largest capacity (4)"] == \
        f"{100 * gains[-1]['vs_best']:+.2f} points"
