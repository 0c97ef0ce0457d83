"""The replay client against a misbehaving server (the stand-in's fault modes, NOT vLLM): whatever the
server does, every request it answered is on disk as a record, and summary.json is strict JSON whose
counts agree with the records."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tongyi_trace.replay.records import read_records
from tongyi_trace.replay.runner import ReplayOptions, run_replay
from tongyi_trace.replay.schedule import ScheduleOptions
from tongyi_trace.replay.standin import FAULTS, StandInState

Standin = Callable[..., tuple[str, StandInState]]
# the error each fault leaves in its record (the request's own error line, never a crash of the replay)
EXPECTED_ERROR = {
    "refuse": "ServerDisconnectedError", "500": "HTTP 500: stand-in [/x] boom", "garbage": "DecodeError",
    "non_object": "stream chunk is not a JSON object", "bad_usage": "'usage' is not an object",
    "truncated": "stream ended without a usage chunk", "close": "ClientPayloadError",
    "hang": "TimeoutError", "trickle": "TimeoutError", "huge_line": "LineTooLong",
}


def _strict_json(path: Path) -> dict[str, Any]:
    def no_constant(name: str) -> None:
        raise AssertionError(f"{path} holds a bare {name}")

    doc: dict[str, Any] = json.loads(path.read_text(), parse_constant=no_constant)
    return doc


@pytest.mark.parametrize("fault", FAULTS)
def test_every_answered_request_is_recorded_and_the_summary_agrees(fault: str, fresh_tiny_run: Path,
                                                                  standin: Standin) -> None:
    url, state = standin(block_size=32, fault=fault, fault_every=2)
    opts = ReplayOptions(name=fault, max_in_flight=1, request_timeout_s=1.5,
                         schedule=ScheduleOptions(speedup=1000.0))
    res = run_replay(fresh_tiny_run, url, opts)
    recs = read_records(res.out_dir / "records.jsonl")
    s = _strict_json(res.out_dir / "summary.json")
    assert s["status"] == "complete"
    assert sorted(recs["req_idx"].to_list()) == list(range(6))  # nothing lost, nothing twice
    ok = recs.filter(recs["status"] == "ok")
    bad = recs.filter(recs["status"] == "error")
    assert sorted(f"kvtrace-{i}" for i in ok["req_idx"].to_list()) == sorted(state.completed)
    assert sorted(f"kvtrace-{i}" for i in bad["req_idx"].to_list()) == sorted(state.faulted)
    assert s["counts"] == {"num_done": 6, "num_ok": ok.height, "num_error": bad.height, "num_cancelled": 0,
                           "num_not_finished": 0}
    if fault == "metrics":
        assert ok.height == 6 and s["metrics"]["hit_ratio"] is None
        assert s["engine"]["block_size"] is None  # the nonsense block size is not believed
        assert s["records_hit_ratio"] == pytest.approx(160 / 360)
    else:
        assert (ok.height, bad.height) == (3, 3)
        assert all(EXPECTED_ERROR[fault] in e for e in bad["error"].to_list()), bad["error"].to_list()
        assert sum(e["count"] for e in s["errors"]) == 3


def test_server_error_text_is_printed_verbatim(fresh_tiny_run: Path, standin: Standin) -> None:
    from typer.testing import CliRunner

    from tongyi_trace.cli import app

    url, _ = standin(fault="500", fault_every=2)
    r = CliRunner().invoke(app, ["replay", str(fresh_tiny_run), "--server", url, "--name", "[bold]b",
                                 "--speedup", "1000", "--max-in-flight", "1"])
    assert r.exit_code == 0, r.output
    assert "3 x HTTP 500: stand-in [/x] boom: injected failure" in r.output
    assert "replay [bold]b complete: 3 ok, 3 failed, 0 not finished" in r.output


def test_a_replay_in_which_every_request_fails_fails(fresh_tiny_run: Path, standin: Standin) -> None:
    """Issue 42 #9: 6 of 6 requests answered HTTP 500 is no complete replay: status failed, the reason in
    summary.json, one line on stderr even with -q, exit 1."""
    from typer.testing import CliRunner

    from tongyi_trace.cli import app

    url, _ = standin(fault="500", fault_every=1)
    r = CliRunner().invoke(app, ["replay", str(fresh_tiny_run), "--server", url, "--name", "all-bad",
                                 "--speedup", "1000", "--max-in-flight", "1", "-q"])
    assert r.exit_code == 1, r.output
    s = _strict_json(fresh_tiny_run / "replay" / "all-bad" / "summary.json")
    assert s["status"] == "failed" and s["counts"]["num_ok"] == 0
    assert s["error"] == "every request failed (6 of 6; most often: HTTP 500: stand-in [/x] boom: injected failure)"
    assert r.output.strip().splitlines() == [f"failed: {s['error']}; the records are in "
                                             f"{fresh_tiny_run / 'replay' / 'all-bad' / 'records.jsonl'}"]


def test_a_password_in_the_server_url_is_never_written(fresh_tiny_run: Path, standin: Standin) -> None:
    """Issue 42 #11: --server http://user:password@host:port connects with it, but neither summary.json, the
    records, the printed summary nor report.html holds the password."""
    from typer.testing import CliRunner

    from tongyi_trace.cli import app

    url, _ = standin()
    secret_url = url.replace("http://", "http://alice:s3cr3t-pw@")
    r = CliRunner().invoke(app, ["replay", str(fresh_tiny_run), "--server", secret_url, "--name", "pw",
                                 "--speedup", "1000", "--max-in-flight", "1"])
    assert r.exit_code == 0, r.output
    s = _strict_json(fresh_tiny_run / "replay" / "pw" / "summary.json")
    assert s["server"] == url and s["counts"]["num_ok"] == 6
    rep = CliRunner().invoke(app, ["report", str(fresh_tiny_run), "-q"])
    assert rep.exit_code == 0, rep.output
    for text in (r.output, (fresh_tiny_run / "replay" / "pw" / "summary.json").read_text(),
                 (fresh_tiny_run / "replay" / "pw" / "records.jsonl").read_text(),
                 (fresh_tiny_run / "report.html").read_text()):
        assert "s3cr3t-pw" not in text


def test_a_timeout_says_how_long_it_waited(fresh_tiny_run: Path, standin: Standin) -> None:
    """Issue 42: a request that timed out was recorded as "TimeoutError: " (aiohttp's error has no text)."""
    url, _ = standin(block_size=32, fault="hang", fault_every=2)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="t", max_in_flight=1, request_timeout_s=1.5,
                                                        schedule=ScheduleOptions(speedup=1000.0)))
    bad = read_records(res.out_dir / "records.jsonl").filter(pl.col("status") == "error")
    assert bad["error"].to_list() == ["TimeoutError: no complete reply within 1.5 s (--request-timeout-s)"] * 3


def test_a_chunk_with_invalid_utf8_text_is_read() -> None:
    """Issue 42: a complete reply whose token text held bytes that are not UTF-8 was recorded as an error."""
    from tongyi_trace.replay.dispatch import _parse_chunk

    obj = _parse_chunk(b'{"choices": [{"text": "caf\xc3"}], "usage": {"prompt_tokens": 5}}')
    assert obj["usage"] == {"prompt_tokens": 5} and obj["choices"] == [{"text": "caf\ufffd"}]
    with pytest.raises(ValueError, match="not a JSON object"):
        _parse_chunk(b"[1, 2]")
