"""`kvtrace fit --capacity` within its memory budget (fit/tune.py over sim/streamed.py's plan_fit): when the
whole stream does not fit, each window is replayed in chunks of the run's tables, and the fitted choice per
capacity, its figures and every candidate's row equal the in-memory fit's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tongyi_trace.budget import MemoryBudget
from tongyi_trace.errors import InputError
from tongyi_trace.fit.events import Window
from tongyi_trace.fit.policy_fit import fit_policy
from tongyi_trace.fit.synth_like import load_workload
from tongyi_trace.fit.tune import tune, window_requests
from tongyi_trace.run import open_run
from tongyi_trace.sim.streamed import SweepPlan, plan_fit


def synth_run(folder: Path, num_requests: int, duration_s: float) -> Path:
    """A to-C trace of NUM_REQUESTS requests over DURATION_S, ingested into FOLDER/run."""
    from tongyi_trace.trace.ingest import ingest_trace
    from tongyi_trace.trace.synth import synth_to_file

    synth_to_file("to-c", 3, folder / "t.jsonl", num_requests=num_requests, duration_s=duration_s)
    ingest_trace(folder / "t.jsonl", folder / "run")
    return folder / "run"


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """800 to-C requests over 20 minutes (~110 k references: two chunks of the smallest budget)."""
    return synth_run(tmp_path_factory.mktemp("streamed-fit"), 800, 1200.0)


def test_streamed_tune_equals_in_memory(small_run: Path, tmp_path: Path) -> None:
    """The streamed plan (passes of 1 and of 4 candidates) chooses what the in-memory plan chooses, with the
    same figures on both windows, from a train window that starts after the trace's start."""
    run = open_run(small_run)
    policy = fit_policy(small_run, tmp_path / "p.json", capacities=None).policy
    arrival_s = run.requests()["arrival_s"].to_numpy()
    t0, t1 = float(arrival_s[0]), float(arrival_s[-1])
    mid = t0 + (t1 - t0) / 2
    train, test = Window(t0 + 60.0, mid, origin_s=t0), Window(mid, t1, True, t0)
    lo, hi = window_requests(arrival_s, train)
    assert 0 < lo < hi < len(arrival_s) and window_requests(arrival_s, test) == (hi, len(arrival_s))
    caps = "0.25L,1L,3%"
    want_choices, want_rows = tune(run, policy, train, test, caps)
    assert [c.policy for c in want_choices] == ["wa", "lru", "wa"]  # golden: WA wins where the cache is short
    for width in (1, 4):
        plan = SweepPlan(True, width, ("streamed",))
        choices, rows = tune(run, policy, train, test, caps, plan=plan, budget=MemoryBudget(0.5))
        assert choices == want_choices
        assert rows == want_rows  # every candidate, both windows, hit ratios and gains exactly
    assert not [p for p in small_run.iterdir() if p.name.startswith(".staging")]  # the spill folders are gone
    assert not (small_run / "sim").exists()  # a fit's chunked passes leave no folder of simulate's


@pytest.mark.full
def test_fit_under_a_small_budget_streams(tmp_path: Path) -> None:
    """825 k references do not fit --memory-limit-gib 0.5 as a whole stream (~0.1 GiB of stream and ~0.05 GiB
    of state a simulation, beyond the interpreter's 0.4): the fit takes the streamed plan, says so, and fits
    the same choices as with the default budget."""
    run = synth_run(tmp_path, 6000, 3600.0)
    small, large = MemoryBudget(0.5), MemoryBudget(6.0)
    assert plan_fit(run, 0, small).streamed and not plan_fit(run, 0, large).streamed
    whole = fit_policy(run, tmp_path / "whole.json", capacities="0.25L,1L", budget=large)
    streamed = fit_policy(run, tmp_path / "streamed.json", capacities="0.25L,1L", budget=small)
    assert whole.memory == {"limit_gib": 6.0, "streamed": False, "jobs": 0, "notes": []}
    assert streamed.memory is not None and streamed.memory["streamed"]
    assert "does not fit --memory-limit-gib 0.5" in streamed.memory["notes"][0]
    assert "no twin model" in streamed.memory["notes"][1]  # it would hold the whole stream: left out, said
    workload = json.loads((run / "fit" / "workload.json").read_text())
    assert workload["twin"] is None and workload["num_requests"] == 6000
    with pytest.raises(InputError, match="no twin model"):
        load_workload(run / "fit" / "workload.json")
    assert streamed.policy.choices == whole.policy.choices
    assert [(c.capacity_blocks, c.policy) for c in whole.policy.choices] == [(6260, "wa"), (25042, "lru")]  # golden
