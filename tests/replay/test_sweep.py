"""`kvtrace replay --sweep` against the stand-in endpoint (the client's side: load points, their speedup and
concurrency, the table, goodput counted from the records; the real engine: tests/replay/test_sweep_engine.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from tests.replay.conftest import KVTRACE
from tongyi_trace.errors import UsageError
from tongyi_trace.replay.records import read_records
from tongyi_trace.replay.runner import ReplayOptions
from tongyi_trace.replay.standin import StandInState
from tongyi_trace.replay.sweep import SweepSpec, meets_slo, parse_slo, parse_sweep, run_sweep

Standin = Callable[..., tuple[str, StandInState]]


@pytest.mark.parametrize(("text", "message"), [
    ("rates=1,2", "give rate or concurrency"), ("rate", "give rate or concurrency"),
    ("rate=1,x", "must be numbers"), ("rate=0,2", "finite numbers > 0"), ("rate=inf", "finite numbers > 0"),
    ("concurrency=1.5", "whole number"), ("rate=2,2", "given twice"),
])
def test_bad_sweeps_say_what_to_give(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_sweep(text)


def test_sweep_and_slo_parse() -> None:
    assert parse_sweep("rate=1,2.5,8") == SweepSpec("rate", (1.0, 2.5, 8.0))
    assert parse_sweep("concurrency=4,1") == SweepSpec("concurrency", (4.0, 1.0))
    assert parse_slo("ttft_ms=500,tpot_ms=50") == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    assert parse_slo(None) == {}
    for bad, message in (("ttft=5", "KEY=MS pairs"), ("ttft_ms=-1", "> 0"), ("tpot_ms=x", "> 0")):
        with pytest.raises(UsageError, match=message):
            parse_slo(bad)


def test_meets_slo_per_request() -> None:
    """ok and within every limit; a missing TPOT (one output token) meets a TPOT limit, a missing TTFT does not."""
    recs = pl.DataFrame({"status": ["ok", "ok", "ok", "error", "ok"], "ttft_ms": [10.0, 60.0, 10.0, 1.0, None],
                         "tpot_ms": [5.0, 5.0, None, 1.0, 1.0], "e2e_ms": [20.0, 70.0, 10.0, None, 9.0]})
    assert meets_slo(recs, {"ttft_ms": 50.0, "tpot_ms": 8.0}).to_list() == [True, False, True, False, False]
    assert meets_slo(recs, {}).to_list() == [True, True, True, False, True]
    assert meets_slo(recs, {"e2e_ms": 15.0}).to_list() == [False, False, True, False, True]


def test_rate_and_concurrency_points(fresh_tiny_run: Path, standin: Standin) -> None:
    """The tiny trace: 6 requests over 30 s. rate=20 is speedup 20 x 30 / 5 = 120 (its schedule ends at
    30 / 120 = 0.25 s); concurrency=2 sends all at 0 with at most 2 in flight. Goodput counts from the records."""
    url, _ = standin(block_size=32, token_delay_s=0.002)
    seen: list[tuple[str, float]] = []
    res = run_sweep(fresh_tiny_run, url, ReplayOptions(name="load"), parse_sweep("rate=20,40"),
                    {"ttft_ms": 1e4, "tpot_ms": 1e4}, on_point=lambda k, v, _r: seen.append((k, v)))
    assert seen == [("rate", 20.0), ("rate", 40.0)] and res.doc["status"] == "complete"
    doc = json.loads(res.path.read_text())
    assert doc["schema"] == "kvtrace.sweep/1" and doc["trace_requests"] == 6 and doc["trace_span_s"] == 30.0
    for row, speedup in zip(doc["rows"], (120.0, 240.0), strict=True):
        assert row["speedup"] == pytest.approx(speedup)
        recs = read_records(fresh_tiny_run / "replay" / row["replay"] / "records.jsonl")
        assert recs["scheduled_s"].max() == pytest.approx(30.0 / speedup)
        assert row["num_ok"] == 6 and row["num_good"] == 6
        assert row["goodput_per_s"] == pytest.approx(6 / row["duration_s"])
        assert row["goodput_per_s"] == pytest.approx(row["requests_per_s"])  # every request within the SLOs
    tight = run_sweep(fresh_tiny_run, url, ReplayOptions(name="closed"), parse_sweep("concurrency=2"),
                      {"ttft_ms": 0.001}).doc["rows"][0]
    recs = read_records(fresh_tiny_run / "replay" / "closed-concurrency2" / "records.jsonl")
    assert recs["scheduled_s"].to_list() == [0.0] * 6 and tight["max_in_flight"] == 2
    assert tight["num_good"] == 0 and tight["goodput_per_s"] == 0.0  # nobody answers within 1 us
    with pytest.raises(UsageError, match="already holds a sweep; pick another --name or pass --overwrite"):
        run_sweep(fresh_tiny_run, url, ReplayOptions(name="closed"), parse_sweep("concurrency=2"), {})


def test_cli_sweep_prints_the_table(fresh_tiny_run: Path, standin: Standin) -> None:
    import subprocess

    url, _ = standin(block_size=32)
    proc = subprocess.run([*KVTRACE, "replay", str(fresh_tiny_run), "--server", url, "--name", "s", "--sweep",
                           "rate=30,60", "--slo", "ttft_ms=10000,tpot_ms=10000"], capture_output=True, text=True,
                          check=False, env={**__import__("os").environ, "COLUMNS": "250"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "load sweep s (rate, complete)" in out and "goodput req/s" in out
    assert "(6 of 6)" in out and "e+" not in out  # people's numbers, no exponents
    assert "rate 30: complete, 6 ok" in proc.stderr
    bad = subprocess.run([*KVTRACE, "replay", str(fresh_tiny_run), "--server", url, "--slo", "ttft_ms=5"],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "--slo goes with --sweep" in bad.stderr


def test_the_report_plots_the_sweep(fresh_tiny_run: Path, standin: Standin) -> None:
    """The report has a section per sweep: throughput and goodput against the load, latencies, the table."""
    from tongyi_trace.report.fmt import quantity
    from tongyi_trace.report.render import build_sections
    from tongyi_trace.run import RunDir

    url, _ = standin(block_size=32)
    doc = run_sweep(fresh_tiny_run, url, ReplayOptions(name="load"), parse_sweep("rate=20,40"),
                    {"ttft_ms": 1e4}).doc
    sections = [s for s in build_sections(RunDir(fresh_tiny_run)) if s.partial == "sweep"]
    assert [s.title for s in sections] == ["Load sweep on vLLM: load"]
    s = sections[0]
    assert set(s.figures) == {"throughput", "latency"}
    assert [r[0] for r in s.tables["points"].rows] == ["20", "40"]
    assert [r[7] for r in s.tables["points"].rows] == [f"{quantity(r['goodput_per_s'])} (6 of 6)" for r in doc["rows"]]
    throughput = s.figures["throughput"].data
    assert [t["name"] for t in throughput] == ["request throughput", "goodput (within SLO)", "offered"]
    assert list(throughput[1]["y"]) == [r["goodput_per_s"] for r in doc["rows"]]


def test_replay_help_names_the_sweep_not_synth() -> None:
    """`kvtrace synth` writes a JSONL trace, not a run folder: replay's help must not send users there."""
    from typer.testing import CliRunner

    from tongyi_trace.cli import app

    out = CliRunner().invoke(app, ["replay", "--help"], env={"COLUMNS": "200"}).output
    assert "kvtrace synth" not in out and "Run folder from 'kvtrace ingest'." in out
    assert "--sweep" in out and "rate=1,2,4,8" in out and "--slo" in out and "ttft_ms=500" in out


def test_a_point_that_cannot_run_leaves_a_failed_sweep(fresh_tiny_run: Path) -> None:
    import socket

    from tongyi_trace.errors import EngineError

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(EngineError, match="unreachable"):
        run_sweep(fresh_tiny_run, url, ReplayOptions(name="gone"), parse_sweep("rate=5"), {})
    doc = json.loads((fresh_tiny_run / "replay" / "gone" / "sweep.json").read_text())
    assert doc["status"] == "failed" and doc["error"].startswith("gone-rate5: server") and doc["rows"] == []
