"""The guard and the online refit on a small shifted stream (tests/guard/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tongyi_trace.errors import UsageError
from tongyi_trace.policy.guard import BACK_FACTOR, LRU, POLICY, Z_CRIT, Guard, Switch
from tongyi_trace.policy.sampling import MIN_SHADOW_BLOCKS, is_sampled, sampled_mask, shadow_rate, threshold
from tongyi_trace.sim.guarded import sampled_stream, simulate_guarded
from tongyi_trace.sim.registry import get_policy
from tongyi_trace.sim.simulate import simulate_policy

from .conftest import CAPACITY, T_SHIFT_S, shifted

BASE = {"model": "exp", "life_s": 30.0, "sample_rate": 1.0}


def _half_hit_ratio(res_hits: np.ndarray, stream, after_s: float, before_s: float = np.inf) -> float:
    m = (stream.req_time_s >= after_s) & (stream.req_time_s < before_s)
    lens = np.diff(stream.req_off)[m]
    return float(res_hits[m].sum() / lens.sum())


def test_sampling_scalar_equals_vector_and_rate() -> None:
    keys = np.arange(-1000, 50_000, dtype=np.int64)
    cut = threshold(1 / 16)
    mask = sampled_mask(keys, cut)
    assert all(mask[i] == is_sampled(int(keys[i]), cut) for i in range(0, keys.size, 97))
    assert abs(mask.mean() - 1 / 16) < 0.005
    assert sampled_mask(keys, threshold(1.0)).all()


def test_sampled_stream_keeps_requests_and_sampled_refs() -> None:
    st = shifted()
    sub = sampled_stream(st, 0.25)
    assert sub.num_requests == st.num_requests
    assert 0.15 < sub.num_refs / st.num_refs < 0.35
    assert np.array_equal(sub.req_cat, st.req_cat)
    assert sampled_stream(st, 1.0).num_refs == st.num_refs


def _steps(g: Guard, leads: list[int], t0_s: float = 0.0, lru_leads: bool = True) -> list[Switch | None]:
    """One 10-s step of 100 sampled references per lead: the leading side has 50 + lead hits, the other 50."""
    return [g.observe(t0_s + 10.0 * (i + 1), 100, 50 + (0 if lru_leads else x), 50 + (x if lru_leads else 0))
            for i, x in enumerate(leads)]


def test_guard_ignores_steps_until_the_lru_shadow_has_evicted() -> None:
    # the same steps as below (a switch at the 4th), but the first two come before the LRU shadow evicts:
    # they are not steps of the rule (no time in mode, no run), so the switch needs two more steps
    g = Guard(margin_points=10.0, window_s=30.0)
    cold = [g.observe_warm(10.0 * (i + 1), 100, 50, 50 + x, lru_evictions=0) for i, x in enumerate([10, 8])]
    assert cold == [None, None] and g.time_in_mode_s == {POLICY: 0.0, LRU: 0.0} and g.estimates() == (0.0, 0.0, 0)
    warm = [g.observe_warm(10.0 * (i + 3), 100, 50, 50 + x, lru_evictions=1) for i, x in enumerate([10, 8, 12, 10])]
    assert warm[:3] == [None, None, None]
    assert warm[3] == Switch(60.0, LRU, 0.5, 0.6)
    assert g.time_in_mode_s[POLICY] == 30.0  # from the first warm step (30 s) to the switch (60 s)


def test_guard_switches_on_a_full_window_of_margin_and_back_on_four_times_that() -> None:
    # evidence bar: margin 10 points x window 30 s = 300 point-seconds
    g = Guard(margin_points=10.0, window_s=30.0)
    # LRU ahead by ~10 points: the run starts at the first step (10 s); 100 x D x run_s after each step is
    # 0 (one step: no test), 90 (D 9, 10 s), 200, 300 -> the switch at 40 s; z = 9, 8.7, 12.2 (>= 2)
    out = _steps(g, [10, 8, 12, 10])
    assert out[:3] == [None, None, None]
    assert out[3] == Switch(40.0, LRU, 0.5, 0.6)  # both sides' hit ratios over the run
    # the policy ahead by ~10 points: back needs BACK_FACTOR x 300 = 1,200 point-seconds. With 10-s steps
    # the evidence is 10 x the summed lead: 10, 18, 30, 40, 50, 58, 70, 80, 90, 98, 110, 120 -> 1,200 at the
    # 12th step, 120 s after the switch (1,100 at 110 s)
    back = _steps(g, [10, 8, 12, 10] * 3, t0_s=40.0, lru_leads=False)
    assert back[:11] == [None] * 11 and back[11] == Switch(160.0, POLICY, 0.6, 0.5)
    assert BACK_FACTOR == 4.0
    assert g.time_in_mode_s == {POLICY: pytest.approx(30.0), LRU: pytest.approx(120.0)}  # from the first step
    assert [s.to_mode for s in g.switches] == [LRU, POLICY]


def test_guard_cuts_a_large_lead_early() -> None:
    # LRU ahead by 40 points: 400 point-seconds after two steps (10 s of run): the switch at 20 s
    g = Guard(margin_points=10.0, window_s=30.0)
    out = _steps(g, [42, 38, 40])
    assert out[0] is None and out[1] == Switch(20.0, LRU, 0.5, 0.9) and out[2] is None


def test_guard_run_restarts_when_the_running_order_leads() -> None:
    # LRU leads for two steps (+20 hits), the policy then leads by 30: the run restarts at 30 s, so the
    # switch waits for 300 point-seconds after that (60 s) instead of counting from 10 s
    g = Guard(margin_points=10.0, window_s=30.0)
    out = _steps(g, [10, 10, -30, 10, 8, 12, 10])
    assert out[:5] == [None] * 5 and out[5] == Switch(60.0, LRU, 0.5, 0.6)
    assert g.run_lead() == (0.0, 0.0, 0.0)  # a new run after a switch
    # the windowed estimates (the last 30 s: 40, 50, 60 s) are the operator's view
    assert g.estimates() == (pytest.approx(0.5), pytest.approx(0.6), 300)


def test_guard_does_not_switch_on_noise() -> None:
    # LRU's mean lead is 2.5 points but each step swings by +-37.5: after 100 steps (990 s, ~2,500
    # point-seconds) z is only 0.66, below Z_CRIT: no switch
    g = Guard(margin_points=10.0, window_s=120.0)
    assert all(s is None for s in _steps(g, [40 if i % 2 else -35 for i in range(1, 101)]))
    d, z, run_s = g.run_lead()
    assert (d, run_s) == (pytest.approx(0.025), 990.0) and z == pytest.approx(0.6633, abs=1e-4) and z < Z_CRIT
    # the same mean lead without the swings switches once 100 x D x run_s reaches 10 x 120 = 1,200: at 500 s
    # (D 2.5, run 490 s; at 490 s: D 2.49 over 480 s, 1,195)
    g2 = Guard(margin_points=10.0, window_s=120.0)
    out = _steps(g2, [3 if i % 2 else 2 for i in range(60)])
    assert [s.time_s for s in out if s is not None] == [500.0]


def test_shadow_rate_holds_min_blocks() -> None:
    assert shadow_rate(1 / 32, 10**6) == 1 / 32
    assert shadow_rate(1 / 32, 4 * MIN_SHADOW_BLOCKS) == 0.25
    assert shadow_rate(1 / 32, 100) == 1.0 and shadow_rate(0.5, 100_000) == 0.5


def test_wa_params_validate_guard_fields() -> None:
    spec = get_policy("wa")
    with pytest.raises(UsageError, match="sample_rate"):
        spec.make_params({"sample_rate": "0"})
    with pytest.raises(UsageError, match="refit_s"):
        spec.make_params({"refit_s": "-1"})
    typed, _ = spec.make_params({"guard": "true", "refit_s": "60"})
    assert typed.active


def test_stale_fit_loses_guard_recovers(first_hour_fit) -> None:
    st = shifted()
    lru = simulate_policy(st, "lru", CAPACITY)
    stale = simulate_policy(st, "wa", CAPACITY, params=BASE, fit=first_hour_fit)
    lru2 = _half_hit_ratio(lru.req_hit_blocks, st, T_SHIFT_S)
    stale2 = _half_hit_ratio(stale.req_hit_blocks, st, T_SHIFT_S)
    assert _half_hit_ratio(stale.req_hit_blocks, st, 0, T_SHIFT_S) >= _half_hit_ratio(
        lru.req_hit_blocks, st, 0, T_SHIFT_S)  # the fit is right at first
    assert lru2 - stale2 > 0.2  # then stale: the hot set is evicted before the scans
    run = simulate_guarded(st, "wa", CAPACITY, params={**BASE, "guard": True, "guard_window_s": 30.0},
                           fit=first_hour_fit)
    assert [s.to_mode for s in run.switches] == [LRU]
    assert T_SHIFT_S < run.switches[0].time_s <= T_SHIFT_S + 60
    guarded2 = _half_hit_ratio(run.result.req_hit_blocks, st, T_SHIFT_S)
    assert lru2 - guarded2 < 0.1  # the loss is the window before the switch
    # with sample_rate 1 the LRU shadow is exact LRU: its slice hit ratios equal LRU's
    tl = run.timeline
    assert sum(r["shadow_lru_hit_ratio"] * r["num_sampled_refs"] for r in tl) == pytest.approx(lru.num_hits)
    assert run.summary()["guard_switches"] == 1
    assert run.summary()["guard_time_lru_s"] == pytest.approx(2 * T_SHIFT_S - run.switches[0].time_s, abs=10)


def test_unshifted_guard_never_switches_and_equals_wa(first_hour_fit) -> None:
    st = shifted(swap=False)
    wa = simulate_policy(st, "wa", CAPACITY, params=BASE, fit=first_hour_fit)
    run = simulate_guarded(st, "wa", CAPACITY, params={**BASE, "guard": True, "guard_window_s": 30.0},
                           fit=first_hour_fit)
    assert run.switches == []
    assert np.array_equal(run.result.req_hit_blocks, wa.req_hit_blocks)


def test_refit_learns_the_swap(first_hour_fit) -> None:
    st = shifted()
    refit_s = 60.0
    run = simulate_guarded(st, "wa", CAPACITY, params={**BASE, "refit_s": refit_s, "window_s": 120.0},
                           fit=first_hour_fit)
    late = [r for r in run.refits if r["time_s"] >= T_SHIFT_S + 2 * refit_s]
    a = [r for r in late if r["category"] == "a"]
    b = [r for r in late if r["category"] == "b"]
    assert a and b and all(r["new_reuse_prob"] < 0.1 for r in a) and all(r["new_reuse_prob"] > 0.9 for r in b)
    # the hot set is reused after exactly 20 s: none by 10 s observed (KM), nearly all by 60 s predicted;
    # past the longest sample (20 s) the observed CDF is unknown (NaN), as kvtrace fit's km_curve says
    assert b[-1]["observed_cdf_10s"] == 0.0 and b[-1]["predicted_cdf_60s"] > 0.9
    assert np.isnan(b[-1]["observed_cdf_60s"]) and b[-1]["ks"] > 0.3
    lru = simulate_policy(st, "lru", CAPACITY)
    after = T_SHIFT_S + 2 * refit_s + 60  # the refit, then the cache's content turns over
    assert _half_hit_ratio(run.result.req_hit_blocks, st, after) >= _half_hit_ratio(lru.req_hit_blocks, st, after)
    assert run.summary()["refits"] == int(2 * T_SHIFT_S // refit_s)  # at 60, 120, ..., 1200 s


def test_plain_policies_run_plain(first_hour_fit) -> None:
    st = shifted()
    run = simulate_guarded(st, "lru", CAPACITY)
    assert run.timeline == [] and run.result.num_hits == simulate_policy(st, "lru", CAPACITY).num_hits


def test_reuse_window_matches_the_fit_definition() -> None:
    """ReuseWindow's samples (fed in batches, dict or array keys) equal the definition of
    tongyi_trace.fit.events: accesses in [T - window, T), observed when the next access is by T."""
    from tongyi_trace.policy.refit import ReuseWindow

    rng = np.random.default_rng(3)
    n = 1500
    times = np.sort(rng.uniform(0, 1000, n))
    keys = rng.integers(0, 100, n)
    cats = rng.integers(0, 3, n)
    now, window_s = 900.0, 300.0
    next_s = np.full(n, np.inf)
    seen: dict[int, float] = {}
    for i in range(n - 1, -1, -1):
        next_s[i] = seen.get(int(keys[i]), np.inf)
        seen[int(keys[i])] = times[i]
    want: dict[int, list[tuple[float, bool]]] = {}
    for i in range(n):
        if now - window_s <= times[i] < now:
            obs = bool(next_s[i] <= now)
            want.setdefault(int(cats[i]), []).append((next_s[i] - times[i] if obs else now - times[i], obs))
    for num_keys in (None, 200):
        w = ReuseWindow(window_s, num_keys)
        upto = int(np.searchsorted(times, now))
        for a in range(0, upto, 37):
            b = min(a + 37, upto)
            w.add(keys[a:b], cats[a:b], times[a:b])
        got = w.samples(now)
        assert set(got) == set(want)
        for c, s in got.items():
            got_c = sorted(zip(s.time_s.tolist(), s.observed.tolist(), strict=True))
            assert [o for _, o in got_c] == [o for _, o in sorted(want[c])]
            assert np.allclose([t for t, _ in got_c], [t for t, _ in sorted(want[c])])
