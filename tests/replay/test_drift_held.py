"""Dispatch drift is the client's own lateness; the time --max-in-flight holds a request back after its due time
is recorded apart (held_ms), against the stand-in endpoint answering slowly (20 ms a token)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from tongyi_trace.replay.records import read_records
from tongyi_trace.replay.runner import ReplayOptions, run_replay
from tongyi_trace.replay.schedule import ScheduleOptions
from tongyi_trace.replay.standin import StandInState

Standin = Callable[..., tuple[str, StandInState]]


def test_one_at_a_time_holds_are_not_drift(fresh_tiny_run: Path, standin: Standin) -> None:
    """The 6 tiny requests are due within 30 ms (speedup 1000) and each takes >= 2 tokens x 20 ms, so with one in
    flight every request after the first waits for the one before: held until it finished, then sent."""
    url, _ = standin(block_size=32, token_delay_s=0.02)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="one", max_in_flight=1,
                                                         schedule=ScheduleOptions(speedup=1000.0)))
    recs = read_records(res.out_dir / "records.jsonl").sort("sent_s")
    assert recs.height == 6 and (recs["status"] == "ok").all()
    late_ms = (recs["sent_s"] - recs["scheduled_s"]) * 1e3
    assert (recs["drift_ms"] + recs["held_ms"] - late_ms).abs().max() < 1e-6  # the lateness, split in two
    assert (recs["held_ms"] >= 0).all() and recs["held_ms"][0] == 0.0
    ready_s = (recs["scheduled_s"] + recs["held_ms"] / 1e3).to_list()
    done_s = (recs["sent_s"] + recs["e2e_ms"] / 1e3).to_list()
    for k in range(1, 6):  # held until the previous request finished (its stream ended), not before
        assert recs["held_ms"][k] > 0
        assert ready_s[k] >= done_s[k - 1] - 1e-3
    s = res.summary
    assert s["held_ms"]["max"] == pytest.approx(float(recs["held_ms"].max()))
    assert s["drift_ms"]["max"] == pytest.approx(float(recs["drift_ms"].max()))
    assert s["held_ms"]["p50"] > s["drift_ms"]["p50"]


def test_without_a_bound_nothing_is_held(fresh_tiny_run: Path, standin: Standin) -> None:
    url, _ = standin(block_size=32, token_delay_s=0.02)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="open", schedule=ScheduleOptions(speedup=1000.0)))
    recs = read_records(res.out_dir / "records.jsonl")
    assert recs.filter(pl.col("held_ms") != 0).height == 0
