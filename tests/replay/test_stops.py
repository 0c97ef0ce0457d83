"""Data-loss defects of replay (each of these tests fails on the code before the fix): --overwrite keeps
the old replay until the new one has started; SIGTERM/SIGHUP finalize the summary like Ctrl-C;
--reconcile-only rebuilds a summary from the records whatever state summary.json is in."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tongyi_trace.errors import EngineError, InputError, UsageError
from tongyi_trace.replay.records import read_records
from tongyi_trace.replay.runner import ReplayOptions, reconcile_only, run_replay
from tongyi_trace.replay.schedule import ScheduleOptions
from tongyi_trace.replay.standin import StandInState

Standin = Callable[..., tuple[str, StandInState]]
FAST = ScheduleOptions(speedup=1000.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_overwrite_keeps_the_old_replay_when_the_new_one_cannot_start(fresh_tiny_run: Path,
                                                                       standin: Standin) -> None:
    url, _ = standin()
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="o", max_in_flight=1, schedule=FAST))
    before = (res.out_dir / "records.jsonl").read_text()
    with pytest.raises(EngineError, match="unreachable"):
        run_replay(fresh_tiny_run, f"http://127.0.0.1:{_free_port()}", ReplayOptions(name="o", overwrite=True))
    with pytest.raises(UsageError, match="speedup"):
        run_replay(fresh_tiny_run, url, ReplayOptions(name="o", overwrite=True,
                                                      schedule=ScheduleOptions(speedup=0.0)))
    with pytest.raises(UsageError, match="request-timeout-s"):
        run_replay(fresh_tiny_run, url, ReplayOptions(name="o", overwrite=True, request_timeout_s=0.0))
    assert (res.out_dir / "records.jsonl").read_text() == before
    assert json.loads((res.out_dir / "summary.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.full)])
def test_a_stop_signal_leaves_a_consistent_summary(sig: signal.Signals, fresh_tiny_run: Path,
                                                   standin: Standin) -> None:
    url, state = standin(token_delay_s=0.15)  # 0.3-1.5 s a request
    out = fresh_tiny_run / "replay" / "s"
    proc = subprocess.Popen([sys.executable, "-m", "tongyi_trace.cli", "replay", str(fresh_tiny_run),
                             "--server", url, "--name", "s", "--speedup", "1000", "--max-in-flight", "1",
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "records.jsonl").is_file() and len((out / "records.jsonl").read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err  # the shell's code for that signal: SIGTERM 143, SIGHUP 129
    assert f"stopped by {sig.name}" in err and "Traceback" not in err
    recs = read_records(out / "records.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["error"] == f"stopped by {sig.name}"
    assert 2 <= recs.height < 6
    assert summary["counts"] == {"num_done": recs.height, "num_ok": recs.height, "num_error": 0, "num_cancelled": 0,
                                 "num_not_finished": 6 - recs.height}
    # the one in flight at the signal finished within the grace: every request the server got is a record
    assert {f"kvtrace-{i}" for i in recs["req_idx"].to_list()} == set(state.completed) == set(state.attempts)


def test_reconcile_only_rebuilds_a_summary_left_running(fresh_tiny_run: Path, standin: Standin) -> None:
    from typer.testing import CliRunner

    from tongyi_trace.cli import app

    url, _ = standin(block_size=32)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="r", max_in_flight=1, schedule=FAST))
    done = res.summary
    # what a replay killed hard (SIGKILL, power loss) leaves: the summary written at start
    started = {k: done[k] for k in ("schema", "run_id", "name", "created_by", "server", "model", "started_at", "trace",
                                    "options", "selection", "engine")}
    (res.out_dir / "summary.json").write_text(json.dumps({**started, "status": "running", "error": None}))
    rebuilt = reconcile_only(fresh_tiny_run, "r").summary
    assert rebuilt["status"] == "interrupted"
    assert rebuilt["counts"] == done["counts"] == {"num_done": 6, "num_ok": 6, "num_error": 0,
                                                   "num_cancelled": 0, "num_not_finished": 0}
    assert rebuilt["records_hit_ratio"] == done["records_hit_ratio"] == pytest.approx(160 / 360)
    assert rebuilt["reconciliation"] == done["reconciliation"]
    assert rebuilt["metrics"]["hit_ratio"] is None  # engine side unknown: said, not invented
    r = CliRunner().invoke(app, ["replay", str(fresh_tiny_run), "--name", "r", "--reconcile-only"])
    assert r.exit_code == 0, r.stderr
    assert "6 ok, 0 failed, 0 not finished" in r.stdout


def test_a_stop_during_the_final_metrics_scrape_still_finalizes(fresh_tiny_run: Path, standin: Standin) -> None:
    url, _ = standin(hang_metrics_after=1)  # the probe's scrape answers; the final one hangs
    out = fresh_tiny_run / "replay" / "m"
    proc = subprocess.Popen([sys.executable, "-m", "tongyi_trace.cli", "replay", str(fresh_tiny_run),
                             "--server", url, "--name", "m", "--speedup", "1000", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        summary_text = (out / "summary.json").read_text() if (out / "summary.json").is_file() else ""
        if '"num_done": 6' in summary_text:  # the records' summary is out: now in the final scrape
            break
        time.sleep(0.05)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["error"] == "stopped while reading the engine's final figures"
    assert summary["counts"] == {"num_done": 6, "num_ok": 6, "num_error": 0, "num_cancelled": 0, "num_not_finished": 0}


def test_a_record_cut_mid_write_counts_as_not_finished(fresh_tiny_run: Path, standin: Standin) -> None:
    url, _ = standin(block_size=32)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="k", max_in_flight=1, schedule=FAST))
    records = res.out_dir / "records.jsonl"
    lines = records.read_text().splitlines()
    records.write_text("\n".join(lines[:5]) + "\n" + lines[5][:40])  # SIGKILL in the middle of the 6th write
    rebuilt = reconcile_only(fresh_tiny_run, "k").summary
    assert rebuilt["counts"] == {"num_done": 5, "num_ok": 5, "num_error": 0, "num_cancelled": 0, "num_not_finished": 1}
    records.write_text("\n".join([lines[0], "{oops", *lines[1:]]) + "\n")
    with pytest.raises(InputError, match=r"records.jsonl:2: not a JSON record"):
        reconcile_only(fresh_tiny_run, "k")


def _replay_until(run: Path, url: str, name: str, ready: Callable[[], bool], *extra: str) -> subprocess.Popen[str]:
    """`kvtrace replay` in a child process, returned once READY() holds (the server got what the test waits for)."""
    proc = subprocess.Popen([sys.executable, "-m", "tongyi_trace.cli", "replay", str(run), "--server", url,
                             "--name", name, "--speedup", "1000", "--quiet", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not ready():
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()
    return proc


def test_a_request_in_flight_at_ctrl_c_finishes_within_the_grace_and_is_recorded(fresh_tiny_run: Path,
                                                                                  standin: Standin) -> None:
    """Issue 42: the request in flight at Ctrl-C left no record though the server served it. Request 0 (10
    output tokens, 0.1 s each) is in flight at the SIGINT; it finishes within the 2 s grace: an ok record."""
    url, state = standin(token_delay_s=0.1)
    proc = _replay_until(fresh_tiny_run, url, "g", lambda: "kvtrace-0" in state.attempts, "--max-in-flight", "1")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    recs = read_records(fresh_tiny_run / "replay" / "g" / "records.jsonl")
    assert recs["req_idx"].to_list() == [0] and recs["status"].to_list() == ["ok"]
    assert recs["output_tokens"].to_list() == [10]
    assert set(state.attempts) == set(state.completed) == {"kvtrace-0"}  # the server served it: recorded
    summary = json.loads((fresh_tiny_run / "replay" / "g" / "summary.json").read_text())
    assert summary["counts"] == {"num_done": 1, "num_ok": 1, "num_error": 0, "num_cancelled": 0,
                                 "num_not_finished": 5}


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.full)])
def test_requests_still_running_after_the_grace_are_recorded_as_cancelled(sig: signal.Signals, fresh_tiny_run: Path,
                                                                         standin: Standin) -> None:
    """Two requests in flight, each a token a second (10 and 5 tokens): at the stop they are cut off after the
    grace, and each is a record of what was known: HTTP 200, the first token's time, status cancelled."""
    url, state = standin(token_delay_s=1.0)
    proc = _replay_until(fresh_tiny_run, url, "c", lambda: {"kvtrace-0", "kvtrace-1"} <= set(state.attempts),
                         "--max-in-flight", "2")
    t_stop = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert time.monotonic() - t_stop < 30  # the grace, not the 10 s the first request needs
    assert "Traceback" not in err and "those cut off: status cancelled" in err
    recs = read_records(fresh_tiny_run / "replay" / "c" / "records.jsonl").sort("req_idx")
    assert recs["req_idx"].to_list() == [0, 1] and set(state.attempts) == {"kvtrace-0", "kvtrace-1"}
    assert recs["status"].to_list() == ["cancelled", "cancelled"] and state.completed == []
    assert recs["http_status"].to_list() == [200, 200]
    assert all(900 <= t < 4000 for t in recs["ttft_ms"].to_list()), recs["ttft_ms"]  # the first token, at ~1 s
    assert recs["output_tokens"].to_list() == [None, None] and recs["e2e_ms"].to_list() == [None, None]
    for e in recs["error"].to_list():
        assert e.startswith("cancelled by the replay's stop ") and "ms after it was sent (HTTP 200, first token " \
            "after " in e, e
    summary = json.loads((fresh_tiny_run / "replay" / "c" / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["counts"] == {"num_done": 0, "num_ok": 0, "num_error": 0, "num_cancelled": 2,
                                 "num_not_finished": 6}
    assert summary["errors"] == []  # a cancellation is no server error


def test_a_request_held_back_by_its_parent_is_not_sent_during_the_grace(fresh_tiny_run: Path,
                                                                        standin: Standin) -> None:
    """--closed-sessions: request 2 waits for its parent 0 (1 s); request 3, a root after it, is sent, then the
    stop: the parent finishes during the grace, and the child is not sent then (nothing is sent after a stop)."""
    url, state = standin(token_delay_s=0.1)
    proc = _replay_until(fresh_tiny_run, url, "p", lambda: "kvtrace-3" in state.attempts, "--closed-sessions")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    recs = read_records(fresh_tiny_run / "replay" / "p" / "records.jsonl")
    assert set(state.attempts) == {f"kvtrace-{i}" for i in recs["req_idx"].to_list()}
    assert "kvtrace-2" not in state.attempts and "kvtrace-0" in state.completed
