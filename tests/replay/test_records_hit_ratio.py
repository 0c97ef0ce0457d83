"""The engine hit ratio from records: one function, one null rule, the same figure in replay and compare."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from tongyi_trace.replay.compare import load_side
from tongyi_trace.replay.metrics import records_hit_ratio
from tongyi_trace.replay.records import RECORD_SCHEMA
from tongyi_trace.replay.runner import ReplayOptions, reconcile_only, run_replay
from tongyi_trace.replay.schedule import ScheduleOptions
from tongyi_trace.replay.standin import StandInState


def _ok(points: list[tuple[int, int | None]]) -> pl.DataFrame:
    return pl.DataFrame([{"prompt_tokens": p, "cached_tokens": c} for p, c in points],
                        schema={k: RECORD_SCHEMA[k] for k in ("prompt_tokens", "cached_tokens")})


def test_requests_without_cached_tokens_are_left_out_and_counted() -> None:
    r = records_hit_ratio(_ok([(100, 50), (300, 0), (200, None), (40, None)]))
    assert r.hit_ratio == pytest.approx(50 / 400)  # not 50 / 640 (counting the unknown as 0)
    assert (r.num_requests, r.cached_tokens, r.prompt_tokens) == (2, 50, 400)
    assert (r.num_without_cached_tokens, r.prompt_tokens_without_cached) == (2, 240)
    assert r.note() == ("2 completed requests (240 prompt tokens) carry no cached_tokens and are left out of "
                        "the engine hit ratio (start vLLM with --enable-prompt-tokens-details)")


def test_all_reported_no_note_and_none_without_tokens() -> None:
    r = records_hit_ratio(_ok([(100, 50), (300, 0)]))
    assert (r.hit_ratio, r.num_without_cached_tokens, r.note()) == (pytest.approx(0.125), 0, None)
    empty = records_hit_ratio(_ok([(200, None)]))
    assert (empty.hit_ratio, empty.num_requests, empty.num_without_cached_tokens) == (None, 0, 1)
    assert records_hit_ratio(_ok([])).hit_ratio is None


def test_replay_summary_and_compare_give_the_same_figure(
        fresh_tiny_run: Path, standin: Callable[..., tuple[str, StandInState]]) -> None:
    url, _ = standin(block_size=32)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="a", max_in_flight=1,
                                                         schedule=ScheduleOptions(speedup=1000.0)))
    # cached_tokens per request (hand-checked in test_replay_standin): 0, 0, 32, 0, 64, 64 of 40, 32, 64,
    # 48, 80, 96 prompt tokens. Take away request 4's cached_tokens (80 prompt tokens, 64 cached).
    path = res.out_dir / "records.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for rec in lines:
        if rec["req_idx"] == 4:
            rec["cached_tokens"] = None
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = reconcile_only(fresh_tiny_run, "a").summary
    side = load_side(res.out_dir)
    expected = (160 - 64) / (360 - 80)
    assert summary["records_hit_ratio"] == side.engine_hit_ratio == pytest.approx(expected)
    assert summary["num_without_cached_tokens"] == side.num_without_cached_tokens == 1
    assert summary["cached_tokens_reported"] is False
    assert any("1 completed requests (80 prompt tokens) carry no cached_tokens" in n for n in side.notes)
