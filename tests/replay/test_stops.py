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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
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
    assert {f"kvtrace-{i}" for i in recs["req_idx"].to_list()} <= set(state.completed)


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
