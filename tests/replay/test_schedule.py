"""Which requests a replay sends and when (golden numbers on tests/fixtures/tiny_bailian.jsonl)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.errors import UsageError
from tongyi_trace.replay.schedule import ScheduleOptions, build_schedule
from tongyi_trace.run import open_run


def _sched(run: Path, max_model_len: int | None = None, **kw: object):  # type: ignore[no-untyped-def]
    return build_schedule(open_run(run).requests(), ScheduleOptions(**kw), max_model_len)  # type: ignore[arg-type]


def test_times_scale_with_speedup_and_parents_link(tiny_run: Path) -> None:
    s = _sched(tiny_run, speedup=2.0)
    assert [r.scheduled_s for r in s.requests] == [0.0, 0.5, 2.5, 3.25, 10.0, 15.0]
    assert [r.parent_req_idx for r in s.requests] == [None, None, 0, None, 2, 4]
    assert [r.max_tokens for r in s.requests] == [10, 5, 8, 3, 4, 2]
    assert [r.category for r in s.requests] == ["text-1", "text-1", "text-2", "search-1", "text-3+", "text-3+"]


def test_window_counts_from_the_first_request() -> None:
    """--start and --duration are seconds from the trace's first request, whatever its clock reads."""
    late = pl.DataFrame({"req_idx": [0, 1, 2], "session_id": [0, 0, 1], "parent_chat_id": [-1, 0, -1],
                         "chat_id": [0, 1, 2], "arrival_s": [900.0, 901.0, 905.0], "input_tokens": [32, 48, 16],
                         "output_tokens": [2, 3, 1], "category": ["text-1", "text-2", "text-1"]})
    s = build_schedule(late, ScheduleOptions(start_s=1.0, duration_s=2.0), None)
    assert [(r.req_idx, r.scheduled_s) for r in s.requests] == [(1, 0.0)] and s.num_in_window == 1
    assert [r.req_idx for r in build_schedule(late, ScheduleOptions(), None).requests] == [0, 1, 2]


def test_window_caps_and_too_long_are_counted(tiny_run: Path) -> None:
    s = _sched(tiny_run, start_s=1.0, duration_s=10.0)
    assert [(r.req_idx, r.scheduled_s) for r in s.requests] == [(1, 0.0), (2, 4.0), (3, 5.5)]
    assert s.num_in_window == 3
    s = _sched(tiny_run, max_model_len=60, max_output_tokens=4)
    # 40+4, 32+4, 48+3 fit in 60; 64+4, 80+4, 96+2 do not
    assert [r.req_idx for r in s.requests] == [0, 1, 3]
    assert [r.max_tokens for r in s.requests] == [4, 4, 3]
    assert (s.num_too_long, s.num_over_max_requests) == (3, 0)
    s = _sched(tiny_run, max_requests=2)
    assert [r.req_idx for r in s.requests] == [0, 1] and s.num_over_max_requests == 4


@settings(max_examples=examples(40), deadline=None)
@given(frac=st.floats(0.05, 1.0), seed=st.integers(0, 1000))
def test_session_sampling_keeps_whole_sessions(tiny_run: Path, frac: float, seed: int) -> None:
    reqs = open_run(tiny_run).requests()
    s = build_schedule(reqs, ScheduleOptions(sample_sessions=frac, seed=seed), None)
    kept = {r.req_idx for r in s.requests}
    for _sid, group in reqs.group_by("session_id"):
        members = set(group["req_idx"].to_list())
        assert members <= kept or not (members & kept)
    assert s.num_sampled_out == reqs.height - len(kept)
    assert [r.scheduled_s for r in s.requests] == sorted(r.scheduled_s for r in s.requests)


@pytest.mark.parametrize("kw", [{"speedup": 0.0}, {"duration_s": -1.0}, {"max_requests": 0},
                                {"sample_sessions": 1.5}, {"max_output_tokens": 0}])
def test_bad_options_are_usage_errors(tiny_run: Path, kw: dict[str, float]) -> None:
    with pytest.raises(UsageError):
        _sched(tiny_run, **kw)
