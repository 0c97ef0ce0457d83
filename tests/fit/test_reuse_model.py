"""The censored maximum-likelihood fit of F(d) = p (1 - exp(-lambda d)), Kaplan-Meier and KS."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.policy.reuse_model import Samples, fit_reuse, kaplan_meier_cdf, km_curve, ks_distance, model_cdf


def samples(observed: list[float], censored: list[float] = (), counts: list[int] | None = None) -> Samples:
    times = np.array([*observed, *censored], dtype=np.float64)
    obs = np.array([True] * len(observed) + [False] * len(censored), dtype=bool)
    cnt = np.ones(len(times), dtype=np.int64) if counts is None else np.array(counts, dtype=np.int64)
    return Samples(times, obs, cnt)


def loglik(s: Samples, p: float, rate: float) -> float:
    """The censored log-likelihood, written independently of the fit's objective."""
    d, c = s.time_s[s.observed], s.time_s[~s.observed]
    wd, wc = s.count[s.observed], s.count[~s.observed]
    return float(np.sum(wd * (np.log(p) + np.log(rate) - rate * d))
                 + np.sum(wc * np.log(1 - p * (1 - np.exp(-rate * c)))))


def test_uncensored_is_the_plain_exponential_mle() -> None:
    fit = fit_reuse(samples([1.0, 2.0, 3.0]))
    assert (fit.reuse_prob, fit.rate_per_s, fit.mean_reuse_s) == (1.0, 0.5, 2.0)
    assert (fit.num_samples, fit.num_observed) == (3, 3)
    # ECDF jumps to 1/3, 2/3, 1 at 1, 2, 3; the largest gap is F(1) - 0 just before the first jump
    assert fit.ks == pytest.approx(1 - math.exp(-0.5))


def test_censoring_far_away_estimates_p_by_the_reused_share() -> None:
    # two reuses after 1 s, one access censored after 1e9 s (certainly never reused): p = 2/3, lambda = 1
    fit = fit_reuse(samples([1.0, 1.0], [1e9]))
    assert fit.reuse_prob == pytest.approx(2 / 3, abs=1e-7)
    assert fit.rate_per_s == pytest.approx(1.0, rel=1e-6)


def test_counts_are_weights() -> None:
    a = fit_reuse(samples([1.0, 4.0], [3.0], counts=[3, 2, 5]))
    b = fit_reuse(samples([1.0] * 3 + [4.0] * 2, [3.0] * 5))
    assert (a.reuse_prob, a.rate_per_s, a.ks) == pytest.approx((b.reuse_prob, b.rate_per_s, b.ks), rel=1e-7)


def test_no_reuse_gives_zero_probability() -> None:
    fit = fit_reuse(samples([], [5.0, 9.0]))
    assert (fit.reuse_prob, fit.rate_per_s, fit.mean_reuse_s) == (0.0, 0.0, math.inf)
    assert fit.ks == 0.0
    empty = fit_reuse(samples([], []))
    assert empty.num_samples == 0 and math.isnan(empty.ks)


def test_kaplan_meier_golden() -> None:
    # reuse at 1 (3 at risk), censored at 2, reuse at 3 (1 at risk): F = 1/3 then 1
    times, cdf = kaplan_meier_cdf(samples([1.0, 3.0], [2.0]))
    assert times.tolist() == [1.0, 3.0]
    assert cdf == pytest.approx([1 / 3, 1.0])
    grid = np.array([0.0, 1.0, 2.5, 3.0, 4.0])
    assert km_curve(samples([1.0, 3.0], [2.0]), grid)[:4] == pytest.approx([0, 1 / 3, 1 / 3, 1.0])
    assert math.isnan(km_curve(samples([1.0, 3.0], [2.0]), grid)[4])  # beyond the largest sample


def test_ties_count_events_before_censorings() -> None:
    # at t=2 one reuse and one censoring, both at risk: S = 1 - 1/2
    _, cdf = kaplan_meier_cdf(samples([2.0], [2.0]))
    assert cdf.tolist() == [0.5]


def test_kaplan_meier_without_censoring_is_the_empirical_cdf() -> None:
    d = np.array([0.5, 0.5, 1.0, 7.0])
    times, cdf = kaplan_meier_cdf(samples(d.tolist()))
    assert cdf == pytest.approx([(d <= t).mean() for t in times])


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 1000.0), st.booleans(), st.integers(1, 20)), min_size=1, max_size=60))
def test_fit_is_a_likelihood_maximum(rows: list[tuple[float, bool, int]]) -> None:
    s = Samples(np.array([r[0] for r in rows]), np.array([r[1] for r in rows]),
                np.array([r[2] for r in rows], dtype=np.int64))
    fit = fit_reuse(s)
    assert 0.0 <= fit.reuse_prob <= 1.0 and fit.rate_per_s >= 0.0
    assert 0.0 <= fit.ks <= 1.0
    if fit.num_observed == 0:
        assert fit.reuse_prob == 0.0
        return
    best = loglik(s, min(fit.reuse_prob, 1 - 1e-15), fit.rate_per_s)
    for dp, dr in ((-0.02, 0), (0.02, 0), (0, 0.97), (0, 1.03), (-0.01, 1.02), (0.01, 0.98)):
        p2 = min(max(fit.reuse_prob + dp, 1e-9), 1 - 1e-15)
        assert loglik(s, p2, fit.rate_per_s * (dr or 1.0)) <= best + 1e-6 * max(1.0, abs(best))


@settings(max_examples=examples(40), deadline=None)
@given(st.floats(0.05, 1.0), st.floats(1e-3, 10.0), st.lists(st.floats(0.0, 50.0), min_size=1, max_size=40))
def test_ks_against_the_definition(p: float, rate: float, d: list[float]) -> None:
    s = samples(d)
    sd = np.sort(d)
    grid = np.unique(np.concatenate([np.linspace(0, max(d), 2001), d]))
    ecdf = np.searchsorted(sd, grid, side="right") / len(d)
    left = np.searchsorted(sd, grid, side="left") / len(d)
    brute = max(np.abs(model_cdf(p, rate, grid) - ecdf).max(), np.abs(model_cdf(p, rate, grid) - left).max())
    assert ks_distance(s, p, rate) == pytest.approx(brute, abs=1e-9)
