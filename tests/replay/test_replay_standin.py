"""The replay client end to end against a stand-in endpoint (tongyi_trace.replay.standin, a small real
HTTP server started by the test; NOT vLLM): hits, failed requests, unreachable server, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from tongyi_trace.errors import EngineError, UsageError
from tongyi_trace.replay.records import read_records
from tongyi_trace.replay.runner import ReplayOptions, run_replay
from tongyi_trace.replay.schedule import ScheduleOptions
from tongyi_trace.replay.standin import StandInState

Standin = Callable[..., tuple[str, StandInState]]
FAST = ScheduleOptions(speedup=1000.0)


def test_identical_block_ids_reach_the_server_as_identical_tokens(fresh_tiny_run: Path, standin: Standin) -> None:
    url, state = standin(block_size=32)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="a", max_in_flight=1, schedule=FAST))
    recs = read_records(res.out_dir / "records.jsonl").sort("req_idx")
    # Hand-checked at 32-token blocks (docs/artifacts/replay.md, prompt layout): req 2 reuses [1,2];
    # req 1 (32 tokens) cannot hit its only block (last-token rule); req 3 starts [2,1]; reqs 4 and 5 reuse
    # [1,2][4,5]; req 5's third block [7,8] was never full before.
    assert recs["cached_tokens"].to_list() == [0, 0, 32, 0, 64, 64]
    assert recs["prompt_tokens"].to_list() == recs["engine_prompt_tokens"].to_list() == [40, 32, 64, 48, 80, 96]
    assert recs["status"].to_list() == ["ok"] * 6
    assert recs["output_tokens"].to_list() == [10, 5, 8, 3, 4, 2]
    s = json.loads((res.out_dir / "summary.json").read_text())
    assert s["status"] == "complete" and s["counts"] == {"num_done": 6, "num_ok": 6, "num_error": 0,
                                                         "num_cancelled": 0, "num_not_finished": 0}
    assert s["metrics"]["hit_ratio"] == pytest.approx(160 / 360)
    assert s["records_hit_ratio"] == pytest.approx(160 / 360)
    assert sorted(state.completed) == sorted(f"kvtrace-{i}" for i in range(6))
    assert (res.out_dir / "cost_model.json").is_file()


def test_reconciliation_against_an_independent_unlimited_cache(fresh_tiny_run: Path, standin: Standin) -> None:
    # The stand-in's cache is unlimited and hashes the tokens it receives: the simulator's engine model
    # (ideal, and LRU at a capacity far beyond the trace) must predict exactly what it reports.
    url, _ = standin(block_size=32)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="r", max_in_flight=1, schedule=FAST))
    rec = pl.read_parquet(res.out_dir / "reconcile.parquet").sort("order")
    assert rec["req_idx"].to_list() == [0, 1, 2, 3, 4, 5]
    assert rec["engine_cached_tokens"].to_list() == [0, 0, 32, 0, 64, 64]
    assert rec["ideal_hit_tokens"].to_list() == rec["engine_cached_tokens"].to_list()
    assert rec["predicted_hit_tokens"].to_list() == rec["engine_cached_tokens"].to_list()
    agg = res.summary["reconciliation"]
    assert (agg["exact_share"], agg["worst"], agg["engine_hit_ratio"]) == (1.0, [], pytest.approx(160 / 360))


def test_failed_requests_are_recorded_and_the_run_goes_on(fresh_tiny_run: Path, standin: Standin) -> None:
    url, _ = standin(fail_every=2)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="f", max_in_flight=1, schedule=FAST))
    recs = read_records(res.out_dir / "records.jsonl").sort("sent_s")
    assert recs["status"].to_list() == ["ok", "error"] * 3
    bad = recs.filter(recs["status"] == "error")
    assert bad["http_status"].to_list() == [500] * 3
    assert all("HTTP 500: stand-in failure of request #" in e for e in bad["error"].to_list())
    assert res.summary["counts"]["num_error"] == 3 and res.summary["status"] == "complete"
    assert res.summary["errors"][0]["count"] == 1


def test_unreachable_server_fails_before_anything_starts(fresh_tiny_run: Path) -> None:
    import socket

    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EngineError, match=f"server http://127.0.0.1:{port} unreachable"):
        run_replay(fresh_tiny_run, f"http://127.0.0.1:{port}", ReplayOptions(name="u"))
    assert not (fresh_tiny_run / "replay" / "u").exists()


def test_too_long_requests_are_skipped_and_counted(fresh_tiny_run: Path, standin: Standin) -> None:
    url, _ = standin(max_model_len=60)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="t", schedule=ScheduleOptions(speedup=1000.0,
                                                                                           max_output_tokens=4)))
    assert res.summary["selection"]["num_too_long"] == 3
    assert sorted(read_records(res.out_dir / "records.jsonl")["req_idx"].to_list()) == [0, 1, 3]
    with pytest.raises(UsageError, match="already holds a replay"):
        run_replay(fresh_tiny_run, url, ReplayOptions(name="t"))


def test_closed_sessions_wait_for_the_parent(fresh_tiny_run: Path, standin: Standin) -> None:
    url, _ = standin(token_delay_s=0.02)
    opts = ReplayOptions(name="c", schedule=ScheduleOptions(speedup=1e6, closed_sessions=True))
    res = run_replay(fresh_tiny_run, url, opts)
    recs = {r["req_idx"]: r for r in read_records(res.out_dir / "records.jsonl").to_dicts()}
    for child, parent in [(2, 0), (4, 2), (5, 4)]:
        assert recs[child]["sent_s"] >= recs[parent]["sent_s"] + recs[parent]["e2e_ms"] / 1e3
    assert recs[3]["sent_s"] < recs[2]["sent_s"]  # another session is not held back


def test_ctrl_c_keeps_finished_records_and_writes_a_summary(fresh_tiny_run: Path, standin: Standin) -> None:
    url, state = standin(token_delay_s=0.15)  # 0.3-1.5 s a request
    out = fresh_tiny_run / "replay" / "i"
    proc = subprocess.Popen([sys.executable, "-m", "tongyi_trace.cli", "replay", str(fresh_tiny_run),
                             "--server", url, "--name", "i", "--speedup", "1000", "--max-in-flight", "1",
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if (out / "records.jsonl").is_file() and len((out / "records.jsonl").read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    recs = read_records(out / "records.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert 2 <= recs.height < 6
    assert summary["counts"]["num_done"] == recs.height
    assert summary["counts"]["num_not_finished"] == 6 - recs.height
    assert set(recs["status"].to_list()) == {"ok"}
    assert {f"kvtrace-{i}" for i in recs["req_idx"].to_list()} <= set(state.completed)


def test_api_key_comes_from_the_named_environment_variable(fresh_tiny_run: Path, standin: Standin,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from tongyi_trace.cli import app

    url, _ = standin(api_key="s3cret")
    with pytest.raises(EngineError, match=r"refused GET /v1/models \(HTTP 401\).*--api-key-env"):
        run_replay(fresh_tiny_run, url, ReplayOptions(name="k"))
    r = CliRunner().invoke(app, ["replay", str(fresh_tiny_run), "--server", url, "--name", "k",
                                 "--api-key-env", "KVTRACE_TEST_KEY", "--speedup", "1000", "--json"],
                           env={"KVTRACE_TEST_KEY": "s3cret"})
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["counts"]["num_ok"] == 6 and summary["options"]["api_key_set"] is True
    assert "s3cret" not in (fresh_tiny_run / "replay" / "k" / "summary.json").read_text()
    r = CliRunner().invoke(app, ["replay", str(fresh_tiny_run), "--server", url, "--name", "k2",
                                 "--api-key-env", "KVTRACE_UNSET_KEY"], env={"KVTRACE_UNSET_KEY": ""})
    assert r.exit_code == 2 and "KVTRACE_UNSET_KEY" in r.stderr


def test_coarse_trace_blocks_are_split_at_the_engine_block_size(tmp_path: Path, standin: Standin) -> None:
    # Mooncake-style 512-token blocks, partial last blocks, against 32-token engine blocks. By hand:
    # r0 [1,2] 700 tok caches 700 // 32 = 21 blocks; r1 [1,2] 1000 tok (block 2 now 488 tok) hits those 21
    # (672 tok) and caches 1000 // 32 = 31; r2 [1,3] 600 tok shares block 1 only: 16 blocks (512 tok);
    # r3 [1,2,4] 1100 tok hits r1's 31 blocks (992 tok).
    from tongyi_trace.trace.ingest import ingest_trace

    rows = [(0, [1, 2], 700), (1000, [1, 2], 1000), (2000, [1, 3], 600), (3000, [1, 2, 4], 1100)]
    trace = tmp_path / "mc.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 3,
                                         "hash_ids": ids}) + "\n" for t, ids, n in rows))
    ingest_trace(trace, tmp_path / "run")
    url, _ = standin(block_size=32)
    res = run_replay(tmp_path / "run", url, ReplayOptions(name="m", max_in_flight=1, schedule=FAST))
    rec = pl.read_parquet(res.out_dir / "reconcile.parquet").sort("order")
    assert rec["engine_cached_tokens"].to_list() == [0, 672, 512, 992]
    assert rec["ideal_hit_tokens"].to_list() == rec["engine_cached_tokens"].to_list()
    assert rec["predicted_hit_tokens"].to_list() == rec["engine_cached_tokens"].to_list()


def test_reconcile_only_recomputes_from_the_records(fresh_tiny_run: Path, standin: Standin) -> None:
    from typer.testing import CliRunner

    from tongyi_trace.cli import app

    url, _ = standin()
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="o", max_in_flight=1, schedule=FAST))
    first = res.summary["reconciliation"]
    (res.out_dir / "reconcile.parquet").unlink()
    r = CliRunner().invoke(app, ["replay", str(fresh_tiny_run), "--name", "o", "--reconcile-only", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["reconciliation"] == first
    assert (res.out_dir / "reconcile.parquet").is_file()
    r = CliRunner().invoke(app, ["replay", str(fresh_tiny_run), "--name", "o"])
    assert r.exit_code == 2 and "--server URL is required" in r.stderr
