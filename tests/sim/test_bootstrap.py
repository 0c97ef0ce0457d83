"""The paired block bootstrap (tongyi_trace/sim/bootstrap.py): known variance on a tiny case, a policy against
itself, the resampling groups and the cache size that reaches a target."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tongyi_trace.errors import UsageError
from tongyi_trace.sim.bootstrap import (
    Interval,
    ideal_hits_per_request,
    make_resampler,
    request_groups,
    size_reaching,
)
from tongyi_trace.sim.stream import stream_from_lists


def test_golden_tiny_case_has_the_known_variance() -> None:
    # four sessions of one request, 10 references each; A's hit ratios 1, 0, 0.5, 0.5, B's 0: the gain's
    # resampled mean has variance sigma^2 / G = 0.125 / 4 (sigma^2: the four ratios' variance, ddof 0)
    refs = np.full(4, 10.0)
    hits_a = np.array([10.0, 0.0, 5.0, 5.0])
    res = make_resampler(np.arange(4), num_resamples=40_000)
    gain = res.ratio_gain(hits_a, np.zeros(4), refs)
    samples = 100 * res.ratio(hits_a, refs)
    assert gain.point == pytest.approx(50.0)
    assert samples.std() == pytest.approx(100 * math.sqrt(0.125 / 4), rel=0.02)  # 17.68 points
    assert samples.mean() == pytest.approx(50.0, abs=0.3)
    # the resampled means take values k/8 (k = 0..8): the 95% interval is [12.5, 87.5] points
    assert (gain.lo, gain.hi) == (pytest.approx(12.5), pytest.approx(87.5))
    assert gain.significant and gain.text() == "+50.00 +- 37.50"


def test_weights_draw_every_group_count_once_per_resample() -> None:
    res = make_resampler(np.array([0, 0, 1, 2, 2, 2]), num_resamples=200)
    assert res.num_groups == 3 and res.weights.shape == (200, 3)
    assert np.all(res.weights.sum(axis=1) == 3)
    assert np.array_equal(res.totals(np.ones(6)), res.weights @ np.array([2.0, 1.0, 3.0]))
    again = make_resampler(np.array([0, 0, 1, 2, 2, 2]), num_resamples=200)
    assert np.array_equal(res.weights, again.weights)  # seeded: the same intervals every run


@settings(max_examples=40)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 20)), min_size=1, max_size=60),
       st.floats(0.5, 0.99))
def test_a_policy_against_itself_is_exactly_zero(cells: list[tuple[int, int]], confidence: float) -> None:
    group = np.array([g for g, _ in cells])
    refs = np.array([r + 1 for _, r in cells], np.float64)
    hits = np.floor(refs * 0.6)
    res = make_resampler(np.unique(group, return_inverse=True)[1], confidence=confidence, num_resamples=50)
    same = res.ratio_gain(hits, hits.copy(), refs)
    assert (same.point, same.lo, same.hi) == (0.0, 0.0, 0.0) and not same.significant
    q = refs * 0.01
    assert res.mean_change(q, q.copy()).to_json() | {"confidence": 0} == {"point": 0.0, "lo": 0.0, "hi": 0.0,
                                                                          "confidence": 0}


def test_a_gain_of_the_same_size_everywhere_has_no_spread() -> None:
    refs = np.full(30, 8.0)
    res = make_resampler(np.arange(30) // 3)
    gain = res.ratio_gain(refs / 2 + 1, refs / 2, refs)
    assert gain.point == pytest.approx(12.5) and gain.lo == pytest.approx(12.5) and gain.hi == pytest.approx(12.5)


def test_groups_are_sessions_or_time_slices() -> None:
    t = np.linspace(0.0, 99.0, 100)
    sessions = np.repeat(np.array([7, 3, 9, 3, 5]), 20)
    g = request_groups(sessions, t)
    assert g.max() == 3 and np.array_equal(g[:20], np.full(20, 2)) and np.array_equal(g[20:40], g[60:80])
    alone = request_groups(np.arange(100), t, num_slices=10)  # no sessions: ten consecutive slices of time
    assert np.array_equal(alone, np.arange(100) // 10)
    assert np.array_equal(request_groups(None, np.zeros(6), num_slices=3), [0, 0, 1, 1, 2, 2])


def test_many_sessions_are_merged_into_clusters() -> None:
    res = make_resampler(np.arange(10_000), max_groups=100, num_resamples=10)
    assert res.num_groups == 100 and np.bincount(res.group).min() == 100  # each cluster holds whole sessions


def test_cache_size_reaching_a_target_is_interpolated() -> None:
    caps = np.array([10.0, 20.0, 40.0])
    hit = np.array([[0.2, 0.4, 0.6], [0.5, 0.6, 0.7], [0.1, 0.2, 0.3]])
    got = size_reaching(caps, hit, np.array([0.5, 0.5, 0.5]))
    assert got[0] == pytest.approx(30.0) and got[1] == 10.0 and math.isinf(got[2])


def test_ideal_hits_per_request_sum_to_the_streams() -> None:
    s = stream_from_lists([[0, 1], [0, 1, 2], [3], [0, 1, 2, 4]])
    ideal = ideal_hits_per_request(s.req_off, s.blk)
    assert ideal.tolist() == [0, 2, 0, 3] and ideal.sum() == s.ideal_hits()


@pytest.mark.parametrize("bad", [0.0, 1.0, 1.5, math.nan])
def test_a_bad_confidence_is_a_usage_error(bad: float) -> None:
    with pytest.raises(UsageError, match="--confidence"):
        make_resampler(np.arange(3), confidence=bad)


def test_interval_text() -> None:
    assert Interval(0.05, -0.26, 0.36, 0.95).text() == "+0.05 +- 0.31"
