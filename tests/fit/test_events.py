"""Reuse-time samples: next-access linking, windows and right-censoring, block lifespans; and the
agreement of the numpy linking with queries/reuse_events.sql."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.analysis.common import AnalysisOptions, open_context
from tongyi_trace.errors import UsageError
from tongyi_trace.fit.events import Window, block_lifespans, load_accesses, parse_window, window_samples
from tongyi_trace.run import open_run

# (arrival_s, type, turn, chain ids): chains 1, 2 live in req 0 -> 1 -> 3; chain 3 in 1 -> 3; 9 in 2 -> 4
TINY = [
    (0.0, "text", 1, [1, 2]),
    (10.0, "text", 2, [1, 2, 3]),
    (15.0, "file", 1, [9]),
    (40.0, "text", 3, [1, 2, 3, 4]),
    (100.0, "file", 1, [9]),
]


def as_rows(samples: dict) -> dict[str, list[tuple[float, bool, int]]]:
    return {c: sorted(zip(s.time_s.tolist(), s.observed.tolist(), s.count.tolist(), strict=True))
            for c, s in samples.items()}


@pytest.fixture
def tiny(make_run: Callable[..., Path]) -> Path:
    return make_run(TINY)


def test_whole_trace_samples(tiny: Path) -> None:
    acc = load_accesses(open_run(tiny).tables())
    assert acc.trace_end_s == 100.0
    got = as_rows(window_samples(acc, parse_window(":", acc.trace_start_s, acc.trace_end_s, "--train")))
    assert got == {
        "text-1": [(10.0, True, 2)],
        "text-2": [(30.0, True, 3)],
        "text-3+": [(60.0, False, 4)],  # never accessed again: censored at the trace end
        "file-1": [(0.0, False, 1), (85.0, True, 1)],  # the last request counts (window reaches the end)
    }


def test_window_censors_at_its_end(tiny: Path) -> None:
    acc = load_accesses(open_run(tiny).tables())
    got = as_rows(window_samples(acc, parse_window("0:30", acc.trace_start_s, acc.trace_end_s, "--train")))
    assert got == {
        "text-1": [(10.0, True, 2)],
        "text-2": [(20.0, False, 3)],  # next access at 40 > 30: censored at 30 - 10
        "file-1": [(15.0, False, 1)],  # next access at 100: censored at 30 - 15
    }
    later = as_rows(window_samples(acc, parse_window("10:40", acc.trace_start_s, acc.trace_end_s, "--test")))
    assert later == {"text-2": [(30.0, True, 3)], "file-1": [(25.0, False, 1)]}  # reuse AT the end is seen


def test_block_lifespans(tiny: Path) -> None:
    acc = load_accesses(open_run(tiny).tables())
    whole = block_lifespans(acc, Window(0.0, 100.0, include_end=True))
    assert {c: sorted(v.tolist()) for c, v in whole.items()} == {
        "text-1": [40.0, 40.0], "text-2": [30.0], "file-1": [85.0]}
    mid = block_lifespans(acc, Window(10.0, 50.0))
    assert {c: sorted(v.tolist()) for c, v in mid.items()} == {"text-2": [30.0, 30.0, 30.0]}


@pytest.mark.parametrize(("text", "message"), [
    ("3600", "expected START:END"), ("a:b", "must be numbers"), ("50:10", "START < END"), ("-5:10", "0 <= START"),
    ("10:10", "START < END"), ("nan:5", "START < END"),
])
def test_bad_windows(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_window(text, 0.0, 100.0, "--train")


def test_window_defaults() -> None:
    assert parse_window(":", 0.0, 70.0, "--train") == Window(0.0, 70.0, include_end=True)
    assert parse_window("5:", 0.0, 70.0, "--train") == Window(5.0, 70.0, include_end=True)
    assert parse_window(":30", 0.0, 70.0, "--train") == Window(0.0, 30.0, include_end=False)
    # a trace whose clock starts at 900 s: the same options, counted from its first request
    late = parse_window("5:30", 900.0, 970.0, "--train")
    assert late == Window(905.0, 930.0, include_end=False, origin_s=900.0)
    assert late.to_json() == {"start_s": 5.0, "end_s": 30.0} and str(late) == "5:30"
    assert parse_window(":", 900.0, 970.0, "--train") == Window(900.0, 970.0, include_end=True, origin_s=900.0)


def sql_events(run: Path) -> pl.DataFrame:
    with open_context(open_run(run).tables(), AnalysisOptions()) as ctx:
        return ctx.query("reuse_events")


def test_sql_golden(tiny: Path) -> None:
    ev = sql_events(tiny).sort("req_idx", "pos")
    assert ev.columns == ["req_idx", "pos", "chain_idx", "access_s", "category", "type", "turn",
                          "next_access_s", "next_req_idx"]
    assert ev["next_req_idx"].to_list() == [1, 1, 3, 3, 3, 4, None, None, None, None, None]
    assert ev["next_access_s"].to_list()[:6] == [10.0, 10.0, 40.0, 40.0, 40.0, 100.0]
    assert ev["category"].to_list()[:5] == ["text-1", "text-1", "text-2", "text-2", "text-2"]


trace_strategy = st.lists(
    st.tuples(st.integers(0, 50).map(float), st.sampled_from(["text", "file", None]), st.integers(1, 4),
              st.lists(st.integers(0, 12), min_size=1, max_size=5, unique=True)),
    min_size=1, max_size=25)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trace_strategy)
def test_numpy_linking_matches_the_sql(make_run: Callable[..., Path], reqs: list) -> None:
    run = make_run([(t, ty, turn if ty else None, ids) for t, ty, turn, ids in reqs], name="prop")
    ev = sql_events(run)
    expected = (ev.group_by("req_idx", pl.col("next_req_idx").fill_null(-1))
                .agg(pl.len().alias("n")).sort("req_idx", "next_req_idx"))
    acc = load_accesses(open_run(run).tables())
    got = pl.DataFrame({"req_idx": acc.pair_req, "next_req_idx": acc.pair_next,
                        "n": acc.pair_count}).sort("req_idx", "next_req_idx")
    assert got.rows() == expected.rows()
    # and the whole-trace samples are exactly the SQL's reuse times / censoring at the trace end
    end = acc.trace_end_s
    samples = window_samples(acc, Window(0.0, end, include_end=True))
    for cat, part in ev.partition_by("category", as_dict=True).items():
        s = samples[cat[0]]
        t = np.where(part["next_access_s"].is_null(), end - part["access_s"],
                     part["next_access_s"].fill_null(0.0) - part["access_s"]).tolist()
        assert sorted(np.repeat(s.time_s, s.count).tolist()) == sorted(t)
        assert s.num_observed == part["next_access_s"].is_not_null().sum()


def test_linking_in_partitions_under_a_budget(known_run: Path) -> None:
    """A run too large to link at once is linked in partitions of its chains, one at a time in this process
    (what fit_policy does under its budget): the same pairs and, chain by chain, the same accesses; the
    accesses are kept as int32 (8 bytes an access, not 16)."""
    from tongyi_trace.executor import ExecutorOptions, PartitionOptions
    from tongyi_trace.fit.events import KEPT_BYTES_PER_REF, LINK_BYTES_PER_REF, budget_partitions

    whole = load_accesses(open_run(known_run).tables())
    one_at_a_time = PartitionOptions(ExecutorOptions("local", None, 1), 3)
    split = load_accesses(open_run(known_run).tables(), partitions=one_at_a_time)
    assert whole.sorted_req.dtype == whole.sorted_chain.dtype == np.int32
    assert np.array_equal(whole.pair_req, split.pair_req) and np.array_equal(whole.pair_count, split.pair_count)
    assert np.array_equal(whole.pair_next, split.pair_next)
    order = np.lexsort((split.sorted_req, split.sorted_chain))
    assert np.array_equal(split.sorted_chain[order], whole.sorted_chain)
    assert np.array_equal(split.sorted_req[order], whole.sorted_req)
    # 186 M references (30x the to-C trace) in a 5.3 GiB budget: 4 partitions; a small run: none
    assert budget_partitions(10**6, 5 << 30) == 1
    refs, room = 186_000_000, int(5.3 * 2**30) - (400 << 20)
    num = budget_partitions(refs, room)
    assert num == 4 and refs * LINK_BYTES_PER_REF / num <= room - refs * KEPT_BYTES_PER_REF
