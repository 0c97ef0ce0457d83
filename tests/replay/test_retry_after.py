"""Issue 42 #9, second half: a server that answers HTTP 429 or 503 with Retry-After is asked again after the
delay it names (bounded, counted in the records and the summary); a request still refused is an error
record. Against the stand-in (NOT vLLM) with `throttle=N`: each request's first N attempts refused."""

from __future__ import annotations

import email.utils
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from tongyi_trace.cli import app
from tongyi_trace.replay.dispatch import retry_after_s
from tongyi_trace.replay.records import read_records
from tongyi_trace.replay.runner import ReplayOptions, run_replay
from tongyi_trace.replay.schedule import ScheduleOptions
from tongyi_trace.replay.standin import StandInState

Standin = Callable[..., tuple[str, StandInState]]
FAST = ScheduleOptions(speedup=1000.0)


def test_retry_after_values() -> None:
    now = 1_700_000_000.0
    assert retry_after_s("2", now) == 2.0
    assert retry_after_s(" 0.25 ", now) == 0.25
    assert retry_after_s(email.utils.formatdate(now + 3, usegmt=True), now) == pytest.approx(3.0)
    assert retry_after_s(email.utils.formatdate(now - 30, usegmt=True), now) == 0.0  # a date gone by: now
    for unreadable in (None, "", "soon", "-1", "nan", "inf", "Mon, 99 Foo 2020"):
        assert retry_after_s(unreadable, now) is None, unreadable


def test_a_throttled_request_is_sent_again_after_the_servers_delay(fresh_tiny_run: Path, standin: Standin) -> None:
    url, state = standin(block_size=32, throttle=2, retry_after="0.2")
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="t", max_in_flight=1, schedule=FAST))
    recs = read_records(res.out_dir / "records.jsonl").sort("req_idx")
    assert recs["status"].to_list() == ["ok"] * 6 and recs["http_status"].to_list() == [200] * 6
    assert recs["retries"].to_list() == [2] * 6
    assert recs["retry_wait_ms"].to_list() == pytest.approx([400.0] * 6)
    for rid, times in state.attempts.items():  # the server saw 3 attempts, each >= its Retry-After apart
        assert len(times) == 3, rid
        assert min(b - a for a, b in itertools.pairwise(times)) >= 0.19, (rid, times)
    s = json.loads((res.out_dir / "summary.json").read_text())
    assert s["status"] == "complete" and s["counts"]["num_ok"] == 6
    assert s["retries"] == {"num_requests": 6, "num_retries": 12, "wait_s": pytest.approx(2.4)}
    assert s["records_hit_ratio"] == pytest.approx(160 / 360)  # the same hits as an unthrottled replay
    assert recs["e2e_ms"].max() < 1000  # TTFT and end-to-end are the last attempt's, not the waits


def test_a_request_still_refused_after_its_retries_is_an_error(fresh_tiny_run: Path, standin: Standin) -> None:
    url, state = standin(throttle=100, throttle_status=503, retry_after="0.1")
    r = CliRunner().invoke(app, ["replay", str(fresh_tiny_run), "--server", url, "--name", "busy", "--speedup",
                                 "1000", "--max-in-flight", "2", "--max-retries", "2", "-q"])
    assert r.exit_code == 1, r.output
    recs = read_records(fresh_tiny_run / "replay" / "busy" / "records.jsonl")
    assert recs.height == 6 and recs["status"].to_list() == ["error"] * 6
    assert set(recs["error"].to_list()) == {"HTTP 503: stand-in: too many requests (after 2 retries)"}
    assert recs["retries"].to_list() == [2] * 6 and recs["http_status"].to_list() == [503] * 6
    assert sorted(len(t) for t in state.attempts.values()) == [3] * 6  # bounded: 1 + 2 attempts each
    s = json.loads((fresh_tiny_run / "replay" / "busy" / "summary.json").read_text())
    assert s["status"] == "failed" and s["retries"]["num_retries"] == 12
    assert "every request failed (6 of 6; most often: HTTP 503" in r.output


def test_a_retry_after_over_the_limit_is_not_waited_for(fresh_tiny_run: Path, standin: Standin) -> None:
    url, state = standin(throttle=1, retry_after="3600")
    t = time.monotonic()
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="long", max_in_flight=1, schedule=FAST))
    assert time.monotonic() - t < 60
    recs = read_records(res.out_dir / "records.jsonl")
    assert set(recs["error"].to_list()) == {"HTTP 429: stand-in: too many requests (Retry-After 3600 s is over "
                                            "the 60 s limit: not retried)"}
    assert recs["retries"].to_list() == [0] * 6 and [len(t) for t in state.attempts.values()] == [1] * 6


def test_without_retry_after_the_wait_doubles_from_one_second(fresh_tiny_run: Path, standin: Standin) -> None:
    url, state = standin(throttle=2, retry_after=None)
    r = CliRunner().invoke(app, ["replay", str(fresh_tiny_run), "--server", url, "--name", "d", "--speedup",
                                 "1000", "--max-requests", "2"])
    assert r.exit_code == 0, r.output
    assert "2 requests retried after HTTP 429/503 (4 retries, 6.0 s waited" in " ".join(r.output.split())
    recs = read_records(fresh_tiny_run / "replay" / "d" / "records.jsonl")
    assert recs.filter(pl.col("status") == "ok").height == 2
    assert recs["retry_wait_ms"].to_list() == pytest.approx([3000.0, 3000.0])  # 1 s, then 2 s
    for times in state.attempts.values():
        assert [round(b - a) for a, b in itertools.pairwise(times)] == [1, 2]


def test_no_retries_when_told_so(fresh_tiny_run: Path, standin: Standin) -> None:
    url, _ = standin(throttle=1, retry_after="0")
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="n", max_in_flight=1, schedule=FAST, max_retries=0))
    recs = read_records(res.out_dir / "records.jsonl")
    assert set(recs["error"].to_list()) == {"HTTP 429: stand-in: too many requests"}
    assert res.summary["retries"] == {"num_requests": 0, "num_retries": 0, "wait_s": 0.0}
