"""Properties of the fleet simulator on random multi-turn workloads (hypothesis): with caches that hold
everything, sticky sessions and the prefix router hit what the trace allows (so at least what round
robin hits), oracle affinity hits the ideal and bounds every router; a single tier changes nothing."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.fleet.routers import ROUTERS
from tongyi_trace.fleet.simulate import Tiers, simulate_fleet
from tongyi_trace.sim.cost_model import CostModel
from tongyi_trace.sim.stream import Stream, stream_from_lists

COST = CostModel("test", overhead_s=0.01, s_per_token=0.001, s_per_loaded_token=0.0002)


@st.composite
def multi_turn(draw: st.DrawFn, shared_prompts: bool) -> tuple[Stream, np.ndarray]:
    """Conversations whose every turn extends the previous one, interleaved in time; the session array
    names each request's conversation. SHARED_PROMPTS: conversations start with one of two system prompts."""
    num_convs = draw(st.integers(1, 6))
    turns = draw(st.lists(st.integers(0, num_convs - 1), min_size=1, max_size=40))
    gaps = draw(st.lists(st.floats(0.0, 0.2), min_size=len(turns), max_size=len(turns)))
    convs: dict[int, list[int]] = {}
    reqs: list[list[int]] = []
    nxt = 100
    for c in turns:
        if c not in convs:
            convs[c] = [c % 2] if shared_prompts else []
        grow = draw(st.integers(1, 3))
        convs[c] += list(range(nxt, nxt + grow))
        nxt += grow
        reqs.append(list(convs[c]))
    times = np.cumsum(gaps).tolist()
    return stream_from_lists(reqs, times_s=times), np.array(turns, np.int64)


@settings(max_examples=examples(60), deadline=None)
@given(multi_turn(shared_prompts=False), st.integers(1, 4))
def test_sticky_and_prefix_routing_hit_at_least_round_robin(case: tuple[Stream, np.ndarray], n: int) -> None:
    stream, session = case
    cap = stream.num_ids  # nothing is evicted: routing alone decides the hits
    rr = simulate_fleet(stream, "rr", n, "lru", cap, cost=COST, session=session).num_hits
    sticky = simulate_fleet(stream, "session:saturation_s=1e9", n, "lru", cap, cost=COST, session=session).num_hits
    prefix = simulate_fleet(stream, "prefix", n, "lru", cap, cost=COST, session=session).num_hits
    assert sticky == prefix == stream.ideal_hits() >= rr


@settings(max_examples=examples(60), deadline=None)
@given(multi_turn(shared_prompts=True), st.integers(1, 4), st.sampled_from(["lru", "fifo", "s3fifo"]))
def test_oracle_affinity_bounds_every_router(case: tuple[Stream, np.ndarray], n: int, policy: str) -> None:
    stream, session = case
    cap = stream.num_ids
    oracle = simulate_fleet(stream, "oracle-affinity", n, policy, cap, cost=COST, session=session)
    assert oracle.num_hits == stream.ideal_hits()
    for name in ROUTERS:
        assert simulate_fleet(stream, name, n, policy, cap, cost=COST, session=session).num_hits <= oracle.num_hits


@settings(max_examples=examples(40), deadline=None)
@given(multi_turn(shared_prompts=True), st.integers(1, 3), st.integers(1, 30),
       st.sampled_from(["rr", "session", "prefix", "kv-aware"]))
def test_one_tier_changes_nothing(case: tuple[Stream, np.ndarray], n: int, cap: int, router: str) -> None:
    stream, session = case
    plain = simulate_fleet(stream, router, n, "lru", cap, cost=COST, session=session)
    for tiers in (Tiers(hbm_blocks=cap), Tiers(hbm_blocks=cap + 5), Tiers(remote_blocks=0)):
        tiered = simulate_fleet(stream, router, n, "lru", cap, cost=COST, session=session, tiers=tiers)
        assert tiered.summary() | {"elapsed_s": 0} == plain.summary() | {"elapsed_s": 0}
        assert np.array_equal(tiered.req_instance, plain.req_instance)


@settings(max_examples=examples(40), deadline=None)
@given(multi_turn(shared_prompts=True), st.integers(1, 3), st.integers(0, 10), st.integers(1, 30))
def test_two_tiers_split_the_hits(case: tuple[Stream, np.ndarray], n: int, spare: int, dram: int) -> None:
    """LRU over LRU (the exact two-tier cache): HBM + DRAM hit what one cache of their sum hits, HBM alone
    what an LRU of HBM's size hits, when no request outgrows HBM (one that does is cached only as far as
    HBM holds it): HBM is SPARE blocks more than the longest request."""
    stream, session = case
    hbm = int(np.diff(stream.req_off).max()) + spare
    cap = hbm + dram
    whole = simulate_fleet(stream, "rr", n, "lru", cap, cost=COST, session=session)
    small = simulate_fleet(stream, "rr", n, "lru", hbm, cost=COST, session=session)
    split = simulate_fleet(stream, "rr", n, "lru", cap, cost=COST, session=session, tiers=Tiers(hbm_blocks=hbm))
    assert split.num_hits == whole.num_hits
    assert split.num_hbm_hits == small.num_hits
    assert split.num_hbm_hits + split.num_dram_hits == split.num_hits
    assert split.qttft["qttft_mean_s"] >= whole.qttft["qttft_mean_s"]  # DRAM hits pay their load
