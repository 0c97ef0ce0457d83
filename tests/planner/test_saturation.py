"""Latency saturation: the single-instance queue's utilization and the instances that keep it below 1."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tongyi_trace.sim.cost_model import CostModel, instances_needed, queue_summary, utilization
from tongyi_trace.sim.sweep import SimulateOptions, simulate_run


def test_utilization_golden() -> None:
    m = CostModel("t", overhead_s=0.5, s_per_token=0.01, s_per_loaded_token=0.0)
    arrival = np.array([0.0, 1.0, 2.0, 4.0])
    q = queue_summary(m, arrival, np.array([100, 100, 100, 100]))  # service 1.5 s each, span 4 s
    assert q["utilization"] == 1.5 and q["saturated"] is True and q["instances_needed"] == 2
    light = queue_summary(m, arrival * 10, np.array([100, 100, 100, 100]))
    assert light["utilization"] == 0.15 and light["saturated"] is False and light["instances_needed"] == 1
    assert utilization(m, np.array([3.0, 3.0]), np.array([1.0, 1.0])) == math.inf
    assert instances_needed(math.inf) is None and instances_needed(0.99) == 1 and instances_needed(1.0) == 2


def test_mooncake_conversation_saturates(mooncake_conversation_run: Path,
                                        private_run: Callable[[Path], Path]) -> None:
    """LRU at 2,000 blocks: one instance cannot keep up; the rows say so and how many would."""
    run = private_run(mooncake_conversation_run)
    res = simulate_run(run, SimulateOptions(policies="lru", capacities="2000,inf", jobs=1))
    assert res.summary["num_saturated"] == 2
    for row in res.rows:
        rho = row["utilization"]
        assert row["saturated"] is True and rho > 1
        assert row["instances_needed"] == math.floor(rho) + 1
    small = res.rows[0]
    assert small["capacity_blocks"] == 2000 and small["qttft_mean_s"] > 1000  # the backlog grows: thousands of s
    # a bigger cache computes fewer tokens: the load falls
    assert res.rows[1]["utilization"] < small["utilization"]


def test_simulate_says_saturation_in_words_in_a_short_answer(mooncake_conversation_run: Path,
                                                             private_run: Callable[[Path], Path]) -> None:
    """The terminal answer fits a screen (the Recommendation and one row per capacity, no developer columns);
    a saturated queue is said in words, its QTTFT named a saturation signal, not a latency; --verbose adds
    every row with its developer columns."""
    from typer.testing import CliRunner

    from tongyi_trace.cli import app

    run = private_run(mooncake_conversation_run)
    args = ["simulate", str(run), "-p", "lru,s3fifo,fifo", "-c", "2000,8000", "-j", "1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert out.startswith("Recommendation\n")
    assert "The queue is saturated at 2000, 8000 (utilization " in out and "not a latency" in out
    assert "ns/evict" not in out and "M refs/s" not in out
    assert len(out.splitlines()) <= 30, out
    rows = [line for line in out.splitlines() if line.startswith("│ 2000 ") or line.startswith("│ 8000 ")]
    assert len(rows) == 2 and all("saturated (" in r for r in rows)  # QTTFT of a saturated queue, flagged
    verbose = CliRunner().invoke(app, [*args, "--verbose"]).stdout
    assert "ns/evict" in verbose and len([ln for ln in verbose.splitlines() if ln.startswith("│ ")]) >= 6
