"""The Recommendation block: targets from the exact LRU curve and the simulated rows, fitted-loses flag."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tongyi_trace.models import GIB, PRESETS
from tongyi_trace.sim.recommend import describe, recommend

SUMMARY = {"ideal_hit_ratio": 0.5, "block_size": 16, "model": "qwen2-7b"}
CURVE = {"capacity_blocks": np.array([0, 10, 40, 100]), "hit_ratio": np.array([0.0, 0.30, 0.44, 0.48])}


def _row(policy: str, cap: str, blocks: int, hit: float, util: float = 0.5) -> dict[str, object]:
    return {"policy": policy, "capacity": cap, "capacity_blocks": blocks, "hit_ratio": hit,
            "qttft_mean_s": 10 * (1 - hit), "utilization": util, "saturated": util >= 1,
            "instances_needed": int(util) + 1}


ROWS = [_row("lru", "a", 20, 0.30, 1.5), _row("s3fifo", "a", 20, 0.42, 1.2), _row("wa", "a", 20, 0.29, 1.6),
        _row("oracle", "a", 20, 0.49), _row("lru", "b", 200, 0.48), _row("s3fifo", "b", 200, 0.47),
        _row("wa", "b", 200, 0.485)]


def test_targets_and_capacities() -> None:
    rec = recommend(ROWS, CURVE, SUMMARY)
    t80, t90, t95 = rec["targets"]
    # LRU from the exact curve: 0.8 x 0.5 = 0.40 first reached at 40 blocks; 0.45 and 0.475 at 100
    assert [t["lru"]["capacity_blocks"] for t in rec["targets"]] == [40, 100, 100]
    assert t80["lru"]["qttft_at"] == "b"  # the next simulated LRU capacity at or above 40 blocks
    # best deployable policy (oracle excluded): s3fifo 0.42 >= 0.40 at a; at 0.45 and 0.475 wa at b
    assert (t80["best"]["policy"], t80["best"]["capacity"]) == ("s3fifo", "a")
    assert (t90["best"]["policy"], t95["best"]["policy"]) == ("wa", "wa")
    a, b = rec["capacities"]
    assert a["best_policy"] == "s3fifo" and a["gain_over_lru_pp"] == pytest.approx(12.0)
    assert a["fitted"]["loses_to_lru"] and not b["fitted"]["loses_to_lru"]
    assert rec["fitted_loses_at"] == ["a"] and rec["saturated_at"] == ["a"] and a["instances_needed"] == 2
    per_block = PRESETS["qwen2-7b"].kv_bytes_per_block(16)
    assert t80["lru"]["size"]["qwen2-7b"]["gib"] == pytest.approx(40 * per_block / GIB)
    assert t80["lru"]["size"]["qwen2-7b"]["x_hbm"] == pytest.approx(40 * per_block / PRESETS["qwen2-7b"].hbm_kv_bytes)
    text = "\n".join(describe(rec))
    assert "WARNING: the fitted policy (wa) loses to LRU at a" in text
    assert "the smallest simulated capacity reaching it: a = 20 blocks = " in text
    assert " with s3fifo, QTTFT mean 5.80 s" in text
    assert "2 instances keep it below 1" in text


def test_not_reached() -> None:
    rec = recommend([_row("lru", "a", 5, 0.1)], {"capacity_blocks": np.array([0, 5]), "hit_ratio": np.array([0, 0.1])},
                    SUMMARY)
    assert all(t["lru"]["capacity_blocks"] is None and t["best"] is None for t in rec["targets"])
    lines = describe(rec)
    assert lines[0].startswith("At a (") and lines[0].endswith("the best policy is lru: +0.00 points over LRU "
                                                               "(no intervals: --no-intervals).")
    assert "LRU never reaches it; no simulated capacity reaches it." in lines[2]


def _gain(row: dict[str, object], point: float, lo: float, hi: float, q: tuple[float, float, float]) -> dict:
    return {**row, "gain_vs_lru_pp": point, "gain_vs_lru_lo_pp": lo, "gain_vs_lru_hi_pp": hi,
            "qttft_change_pct": q[0], "qttft_change_lo_pct": q[1], "qttft_change_hi_pct": q[2]}


def test_the_answer_runs_lru_unless_a_gain_is_significant() -> None:
    zero = (0.0, 0.0, 0.0)
    rows = [_gain(_row("lru", "a", 20, 0.30), 0, 0, 0, zero),
            _gain(_row("s3fifo", "a", 20, 0.42), 12.0, 10.9, 13.1, (-41.0, -47.0, -35.0)),
            _gain(_row("fifo", "a", 20, 0.43), 13.0, 9.0, 17.0, (-42.0, -50.0, -30.0)),  # higher point, lower bound
            _gain(_row("oracle", "a", 20, 0.49), 19.0, 18.0, 20.0, zero),  # a bound: never the answer
            _gain(_row("lru", "b", 200, 0.48), 0, 0, 0, zero),
            _gain(_row("s3fifo", "b", 200, 0.484), 0.4, -0.2, 1.0, (-1.0, -2.0, 0.5))]
    summary = {**SUMMARY, "intervals": {"confidence": 0.95, "resampled": "sessions", "num_groups": 40,
                                        "num_resamples": 1000,
                                        "targets": [{"target": 0.8, "lru_capacity_blocks": {"point": 40.0, "lo": 31.0,
                                                                                            "hi": 52.0}}]}}
    rec = recommend(rows, CURVE, summary)
    a, b = rec["capacities"]
    assert a["best_policy"] == "fifo" and a["run_policy"] == "s3fifo"  # the highest lower bound, as fit chooses
    assert a["run_gain_pp"] == {"point": 12.0, "lo": 10.9, "hi": 13.1}
    assert b["run_policy"] == "lru" and b["closest"] == {"policy": "s3fifo", "gain_pp": {"point": 0.4, "lo": -0.2,
                                                                                          "hi": 1.0}}
    assert rec["intervals"]["resampled"] == "sessions" and "targets" not in rec["intervals"]
    lines = describe(rec)
    assert lines[0].startswith("At a (") and lines[0].endswith(" run s3fifo: +12.00 +- 1.10 points over LRU, "
                                                               "QTTFT -41.0% +- 6.0%.")
    assert lines[1].endswith(" run LRU: no policy is significantly better here at 95% (best: s3fifo +0.40 +- 0.60 "
                             "points).")
    assert "LRU needs 40 blocks (interval 31-52 blocks) = " in lines[3]


def test_report_opens_with_recommendation(mooncake_conversation_run: Path,
                                          private_run: Callable[[Path], Path]) -> None:
    from tongyi_trace.report.render import build_sections
    from tongyi_trace.run import open_run
    from tongyi_trace.sim.sweep import SimulateOptions, simulate_run

    run = private_run(mooncake_conversation_run)
    simulate_run(run, SimulateOptions(policies="lru,s3fifo", capacities="2000,5%", jobs=1))
    sections = build_sections(open_run(run))
    first = sections[0]
    assert first.key == "recommendation"
    assert first.values["saturated_at"] == "2000, 5%"
    assert [r[0] for r in first.tables["capacities"].rows] == ["2000", "5%"]
