"""compare's paired intervals (B against A, by the one block bootstrap of sim/bootstrap.py) on replays of the
tiny fixture against the stand-in endpoint (a real HTTP server with an unlimited prefix cache; NOT vLLM)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from tests.replay.conftest import kvtrace_cli
from tongyi_trace.errors import InputError, UsageError
from tongyi_trace.replay.compare import compare_replays, paired_intervals
from tongyi_trace.replay.records import read_records
from tongyi_trace.replay.runner import ReplayOptions, run_replay
from tongyi_trace.replay.schedule import ScheduleOptions
from tongyi_trace.replay.standin import StandInState

Standin = Callable[..., tuple[str, StandInState]]
FAST = ScheduleOptions(speedup=1000.0)


def _replay(run: Path, standin: Standin, name: str, **state: float | str) -> Path:
    url, _ = standin(**state)
    return run_replay(run, url, ReplayOptions(name=name, max_in_flight=1, schedule=FAST)).out_dir


@pytest.fixture
def two_replays(fresh_tiny_run: Path, standin: Standin) -> tuple[Path, Path]:
    """The tiny trace replayed on a stand-in caching 32-token blocks (A) and one caching 16-token blocks (B)."""
    return _replay(fresh_tiny_run, standin, "a", block_size=32), _replay(fresh_tiny_run, standin, "b", block_size=16)


def test_a_replay_against_itself_is_exactly_zero(two_replays: tuple[Path, Path]) -> None:
    a, _ = two_replays
    iv = compare_replays(a, a).intervals
    assert iv is not None and iv.num_paired == 6 and iv.resampled == "sessions"
    for got in (iv.engine_hit_ratio_pp, iv.ttft_mean_change_pct):
        assert got is not None and (got.point, got.lo, got.hi) == (0.0, 0.0, 0.0)


def test_golden_hit_ratio_interval_from_the_three_sessions(two_replays: tuple[Path, Path]) -> None:
    # Cached tokens (unlimited stand-in cache, a hit never covers the last prompt token), prompts
    # [40, 32, 64, 48, 80, 96]: at 32-token blocks [0, 0, 32, 0, 64, 64] (test_replay_standin.py), at 16-token
    # blocks [0, 16, 32, 0, 64, 80]. The sessions: {0, 2, 4, 5} (B - A: 16 of 280 tokens), {1} (16 of 32),
    # {3} (0 of 48). Point: 32 / 360 = +8.89 points. A resample draws 3 sessions with replacement; its lowest
    # value, session {3} three times, is 0 and its highest, {1} three times, 48 / 96 = +50 points; each has
    # probability 1/27 = 3.7% > 2.5%, so the 95% percentile interval is [0, 50].
    a, b = two_replays
    comp = compare_replays(a, b)
    iv = comp.intervals
    assert iv is not None
    assert (iv.num_paired, iv.num_only_a, iv.num_only_b, iv.num_groups) == (6, 0, 0, 3)
    hit = iv.engine_hit_ratio_pp
    assert hit is not None
    assert hit.point == pytest.approx(100 * 32 / 360) == pytest.approx(100 * comp.diff["engine_hit_ratio"])
    assert (hit.lo, hit.hi) == (0.0, pytest.approx(50.0))
    assert hit.text() == "+8.89 +- 25.00" and not hit.significant
    # the TTFT change: the point is the two replays' mean TTFT over the same requests, inside its interval
    ra, rb = (read_records(p / "records.jsonl").sort("req_idx") for p in (a, b))
    want = 100 * (rb["ttft_ms"].mean() / ra["ttft_ms"].mean() - 1)  # type: ignore[operator]
    ttft = iv.ttft_mean_change_pct
    assert ttft is not None and ttft.point == pytest.approx(want) and ttft.lo <= ttft.point <= ttft.hi
    doc = json.loads(comp.output_path.read_text())  # type: ignore[union-attr]
    assert doc["intervals"]["engine_hit_ratio_pp"] == {"point": pytest.approx(8.8889, abs=1e-4), "lo": 0.0,
                                                       "hi": pytest.approx(50.0), "confidence": 0.95}
    assert doc["intervals"]["resampled"] == "sessions" and doc["intervals"]["num_resamples"] == 1000


def test_only_requests_ok_in_both_are_paired_and_the_rest_counted(fresh_tiny_run: Path, standin: Standin) -> None:
    a = _replay(fresh_tiny_run, standin, "a", block_size=32)
    b = _replay(fresh_tiny_run, standin, "b", block_size=32, fail_every=2)  # the 2nd, 4th and 6th sent fail
    comp = compare_replays(a, b)
    iv = comp.intervals
    assert iv is not None and (iv.num_paired, iv.num_only_a, iv.num_only_b) == (3, 3, 0)
    assert "intervals: 3 request(s) finished OK in A only and 0 in B only are left out (3 paired)" in comp.notes
    hit = iv.engine_hit_ratio_pp
    assert hit is not None and (hit.point, hit.lo, hit.hi) == (0.0, 0.0, 0.0)  # the same cache on paired requests
    # B's hits differ from A's only where B's cache missed the failed requests' blocks: the pairs hold that
    ok_b = read_records(b / "records.jsonl").filter(pl.col("status") == "ok")
    ok_a = read_records(a / "records.jsonl").filter(pl.col("req_idx").is_in(ok_b["req_idx"].implode()))
    assert ok_a.sort("req_idx")["cached_tokens"].to_list() == ok_b.sort("req_idx")["cached_tokens"].to_list()


def test_requests_without_cached_tokens_are_left_out_and_counted(two_replays: tuple[Path, Path]) -> None:
    a, b = two_replays
    ra = read_records(a / "records.jsonl")
    rb = read_records(b / "records.jsonl").with_columns(
        cached_tokens=pl.when(pl.col("req_idx") == 1).then(None).otherwise(pl.col("cached_tokens")))
    iv = paired_intervals(ra, rb)
    assert iv.num_without_cached_tokens == 1 and iv.num_without_ttft == 0
    hit = iv.engine_hit_ratio_pp
    assert hit is not None and hit.point == pytest.approx(100 * 16 / 328)  # request 1 out of both sides
    assert "1 paired request(s) without cached_tokens in A or B are left out" in " ".join(iv.notes())


def test_a_bad_confidence_is_refused_in_one_line(two_replays: tuple[Path, Path]) -> None:
    a, b = two_replays
    with pytest.raises(UsageError, match=r"--confidence 1\.5: give a confidence level strictly between 0 and 1"):
        compare_replays(a, b, confidence=1.5)


def test_cli_prints_the_interval_in_points(two_replays: tuple[Path, Path]) -> None:
    a, b = two_replays
    out = kvtrace_cli("compare", str(a), str(b), "-o", str(a.parent / "cmp.json"))
    assert "engine hit ratio B - A: +8.89 +- 25.00 points" in out
    assert "TTFT mean B vs A: " in out
    doc = json.loads(kvtrace_cli("compare", str(a), str(b), "--json", "--confidence", "0.9",
                                 "-o", str(a.parent / "cmp.json")))
    assert doc["intervals"]["confidence"] == 0.9
    assert doc["intervals"]["engine_hit_ratio_pp"]["point"] == pytest.approx(100 * 32 / 360)


def test_the_reports_comparison_section_carries_the_intervals(two_replays: tuple[Path, Path]) -> None:
    from tongyi_trace.report.sections import compare as section
    from tongyi_trace.run import open_run

    a, b = two_replays
    compare_replays(a, b)
    (got,) = section.build(open_run(a.parent.parent))
    rows = {r[0]: r[-1] for r in got.tables["sides"].rows}
    assert rows["engine hit ratio b - a, 95% interval"] == "+8.89 +- 25.00 points [+0.00, +50.00]"
    assert rows["TTFT mean change b vs a, 95% interval"].endswith("]") and "% [" in rows[
        "TTFT mean change b vs a, 95% interval"]
    assert rows["intervals: paired requests"] == "6 requests OK in both, bootstrap over 3 sessions"
    assert got.headline[0].value == "+8.89 +- 25.00 points [+0.00, +50.00]"


def test_a_trace_without_sessions_is_resampled_by_time_slices(tmp_path: Path, standin: Standin) -> None:
    from tongyi_trace.trace.ingest import ingest_trace

    trace = tmp_path / "mooncake.jsonl"  # no sessions (ingested without inferring them): every request its own
    trace.write_text("".join(json.dumps({"timestamp": 1000 * i, "input_length": 1024, "output_length": 2,
                                         "hash_ids": [1, 2, i + 3]}) + "\n" for i in range(8)))
    run = tmp_path / "run"
    ingest_trace(trace, run, infer_sessions=False)
    a = _replay(run, standin, "a", block_size=512)
    b = _replay(run, standin, "b", block_size=256)
    iv = compare_replays(a, b).intervals
    # 8 requests 1 s apart over 7 s: 50 slices of 0.14 s, each request in its own slice
    assert iv is not None and (iv.resampled, iv.num_groups, iv.num_paired) == ("time slices", 8, 8)
    # 1024-token prompts, the first block shared by all: at 512-token blocks 512 cached from the 2nd request
    # on, at 256-token blocks 768 (the last token never hits): +256 tokens on 7 of 8 requests
    hit = iv.engine_hit_ratio_pp
    assert hit is not None and hit.point == pytest.approx(100 * 7 * 256 / 8192)
    assert 0.0 < hit.lo < hit.point < hit.hi == pytest.approx(25.0)  # the best slices: +256 of 1024 tokens
    same = compare_replays(b, b).intervals
    assert same is not None and same.engine_hit_ratio_pp is not None
    assert (same.engine_hit_ratio_pp.lo, same.engine_hit_ratio_pp.hi) == (0.0, 0.0)


def test_a_request_recorded_twice_is_refused(two_replays: tuple[Path, Path]) -> None:
    a, _ = two_replays
    ra = read_records(a / "records.jsonl")
    with pytest.raises(InputError, match=r"replay B: request 2 finished OK twice in records\.jsonl"):
        paired_intervals(ra, pl.concat([ra, ra.filter(pl.col("req_idx") == 2)]))
