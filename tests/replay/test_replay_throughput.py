"""Replay summary figures `vllm bench serve` users expect: throughput, TPOT and ITL; the report shows them and
the requests skipped as too long (stand-in endpoint, NOT vLLM)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tongyi_trace.replay.records import read_records
from tongyi_trace.replay.runner import ReplayOptions, run_replay
from tongyi_trace.replay.schedule import ScheduleOptions
from tongyi_trace.replay.standin import StandInState
from tongyi_trace.report.render import build_sections
from tongyi_trace.run import open_run

Standin = Callable[..., tuple[str, StandInState]]


def test_tpot_itl_throughput_and_too_long(fresh_tiny_run: Path, standin: Standin) -> None:
    url, _ = standin(max_model_len=60, token_delay_s=0.002)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="t", schedule=ScheduleOptions(speedup=1000.0,
                                                                                           max_output_tokens=4)))
    s = res.summary
    recs = read_records(res.out_dir / "records.jsonl")
    assert recs.height == 3 and s["counts"]["num_ok"] == 3
    for r in recs.iter_rows(named=True):
        n = r["output_tokens"]
        assert len(r["itl_ms"]) == n - 1  # one chunk a token: n - 1 gaps
        if n > 1:
            assert r["tpot_ms"] == pytest.approx(sum(r["itl_ms"]) / (n - 1), rel=1e-3, abs=1e-3)
    all_itl = sorted(x for r in recs["itl_ms"].to_list() for x in r)
    assert s["itl_ms"]["max"] == pytest.approx(all_itl[-1]) and s["tpot_ms"]["p50"] is not None
    t = s["throughput"]
    assert t["requests_per_s"] == pytest.approx(3 / t["span_s"])
    out = int(recs["output_tokens"].sum())
    assert out > 3 and t["output_tokens_per_s"] == pytest.approx(out / t["span_s"])
    assert t["total_tokens_per_s"] == pytest.approx((out + int(recs["prompt_tokens"].sum())) / t["span_s"])
    section = next(x for x in build_sections(open_run(fresh_tiny_run)) if x.key == "replay-0")
    rows = dict(section.tables["run"].rows)  # type: ignore[arg-type]
    assert rows["skipped as too long for the engine"].startswith("3 of 6: prompt + forced output tokens exceed "
                                                                 "the engine's max_model_len (60)")
    assert "n/a" not in rows["ITL P50 / P99 (between streamed chunks)"]
