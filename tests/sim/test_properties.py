"""Property tests over random prefix-chained streams (hypothesis)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.errors import UsageError
from tongyi_trace.policy.file import CategoryParams, PolicyParams
from tongyi_trace.sim.kernel import S_EVICT_CYCLES
from tongyi_trace.sim.lru_curve import lru_curve
from tongyi_trace.sim.registry import Policy, get_policy
from tongyi_trace.sim.simulate import Cache, simulate_policy
from tongyi_trace.sim.stream import Stream, stream_from_lists
from tongyi_trace.sim.structs import NARROW_ROWS, NUM_ROWS, PRESENT, aligned_zeros, inserted_at, nchild

FIT = PolicyParams(categories={"a": CategoryParams(0.8, 0.5, 2.0, 5.0), "b": CategoryParams(0.2, 0.05, 20.0, 50.0)},
                   default=CategoryParams(0.5, 0.1, 10.0, 10.0))


@st.composite
def streams(draw: st.DrawFn) -> Stream:
    """Requests that continue a random earlier request's prefix with fresh blocks (ids are prefix-chained)."""
    n = draw(st.integers(1, 25))
    reqs: list[list[int]] = []
    fresh = 0
    for _ in range(n):
        base: list[int] = []
        if reqs and draw(st.booleans()):
            parent = reqs[draw(st.integers(0, len(reqs) - 1))]
            base = parent[: draw(st.integers(0, len(parent)))]
        extra = draw(st.integers(0 if base else 1, 5))
        reqs.append(base + list(range(fresh, fresh + extra)))
        fresh += extra
    times = sorted(draw(st.lists(st.floats(0, 100), min_size=n, max_size=n)))
    cats = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=n, max_size=n))
    return stream_from_lists(reqs, times_s=times, categories=cats)


ALL = [p.value for p in Policy]


@settings(max_examples=examples(60), deadline=None)
@given(streams(), st.integers(1, 12))
def test_counts_add_up(s: Stream, capacity: int) -> None:
    for pol in ALL:
        r = simulate_policy(s, pol, capacity, fit=FIT)
        assert r.num_refs == s.num_refs
        assert 0 <= r.num_hits <= s.ideal_hits()
        assert int(r.req_hit_blocks.sum()) == r.num_hits
        assert sum(c["num_refs"] for c in r.per_category.values()) == r.num_refs
        assert sum(c["num_hits"] for c in r.per_category.values()) == r.num_hits
        assert 0.0 <= r.hit_ratio <= 1.0 and 0.0 <= r.token_hit_ratio <= 1.0


@settings(max_examples=examples(60), deadline=None)
@given(streams())
def test_lru_and_oracle_never_fall_and_oracle_bounds_all(s: Stream) -> None:
    prev = {"lru": -1, "oracle": -1}
    for cap in range(1, s.num_ids + 2):
        hits = {pol: simulate_policy(s, pol, cap, fit=FIT).num_hits for pol in ALL}
        for pol in prev:
            assert hits[pol] >= prev[pol], (pol, cap)
            prev[pol] = hits[pol]
        assert hits["oracle"] == max(hits.values()), (cap, hits)


@settings(max_examples=examples(60), deadline=None)
@given(streams())
def test_unlimited_capacity_is_the_ideal(s: Stream) -> None:
    for pol in ALL:
        assert simulate_policy(s, pol, s.num_ids, fit=FIT).num_hits == s.ideal_hits()


@settings(max_examples=examples(80), deadline=None)
@given(streams())
def test_one_pass_curve_equals_lru_at_every_capacity(s: Stream) -> None:
    curve = lru_curve(s)
    for cap in range(0, s.num_ids + 2):
        r = simulate_policy(s, "lru", cap)
        assert curve.hits(cap) == r.num_hits, cap
        assert curve.token_hit_ratio(cap) == r.token_hit_ratio


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(st.lists(st.integers(0, 8), min_size=1, max_size=6, unique=True), min_size=1, max_size=20))
def test_one_pass_curve_equals_lru_without_prefix_chaining(reqs: list[list[int]]) -> None:
    # Arbitrary ids (a block may follow different parents, or be cached without its parent): the curve
    # uses the max stack distance over the prefix, the simulator the prefix rule; they still agree.
    s = stream_from_lists(reqs)
    curve = lru_curve(s)
    for cap in range(0, s.num_ids + 2):
        assert curve.hits(cap) == simulate_policy(s, "lru", cap).num_hits, cap


@settings(max_examples=examples(80), deadline=None)
@given(streams(), st.integers(1, 12))
def test_leaf_only_never_evicts_a_block_with_cached_children(s: Stream, capacity: int) -> None:
    # Prefix closure, for every policy that can take it: no eviction orphans a cached child, so no
    # reference ever meets a cached block behind a missing ancestor.
    for pol in ALL:
        r = simulate_policy(s, pol, capacity, fit=FIT, params={"leaf_only": True})
        assert r.num_orphaning_evictions == 0 and r.orphaned_refs == 0, pol
        assert r.params["leaf_only"] is True
    assert simulate_policy(s, "wa", capacity, fit=FIT).params["leaf_only"] is True  # WA's default


@settings(max_examples=examples(80), deadline=None)
@given(streams(), st.integers(1, 12))
def test_prefix_closed_policies_never_choose_a_block_with_cached_children(s: Stream, capacity: int) -> None:
    # The policies that declare PREFIX_CLOSED (the kernel then keeps no count of cached children without
    # leaf_only, so it could count no orphaning eviction): with the count kept (leaf_only), none of their
    # victims is ever held back, so leaf_only changes nothing and no eviction can orphan a block.
    closed = [(p, kv) for p in ALL if getattr(get_policy(p).hooks, "PREFIX_CLOSED", False)
              for kv in ([{"knows": "future"}, {"knows": "dead"}] if p == "oracle" else [{}])]
    assert sorted({p for p, _ in closed}) == ["lru", "oracle"]
    for pol, kv in closed:
        tracked = simulate_policy(s, pol, capacity, params={**kv, "leaf_only": True})
        plain = simulate_policy(s, pol, capacity, params={**kv, "leaf_only": False})
        assert tracked.num_parked == 0 and tracked.num_orphaning_evictions == 0, (pol, kv)
        assert plain.orphaned_refs == 0 and plain.num_orphaning_evictions == 0, (pol, kv)
        assert plain.req_hit_blocks.tolist() == tracked.req_hit_blocks.tolist(), (pol, kv)
        assert plain.num_evictions == tracked.num_evictions, (pol, kv)


def _widened(c: Cache) -> Cache:
    """C (not yet served) with its narrow state copied into a full row (structs.NUM_ROWS)."""
    bk = c.state[0]
    wide = aligned_zeros((bk.shape[0], NUM_ROWS))
    wide[:, :NARROW_ROWS] = bk
    c.state = (wide, *c.state[1:])
    return c


@settings(max_examples=examples(60), deadline=None)
@given(streams(), st.integers(1, 12))
def test_a_narrow_state_gives_the_same_results(s: Stream, capacity: int) -> None:
    # A policy without a heap or columns of its own keeps one cache line per block (structs.NARROW_ROWS),
    # counting cached children or not; the full row gives the same results, stat by stat.
    for pol, leaf_only in [("lru", False), ("lru", True), ("fifo", False), ("fifo", True)]:
        params = {"leaf_only": leaf_only}
        narrow = Cache(s, pol, capacity, params=params)
        wide = _widened(Cache(s, pol, capacity, params=params))
        assert narrow.state[0].shape[1] == NARROW_ROWS
        for c in (narrow, wide):
            c.serve(0, s.num_requests)
        a, b = narrow.result(), wide.result()
        assert a.req_hit_blocks.tolist() == b.req_hit_blocks.tolist(), pol
        assert (narrow.stats[:S_EVICT_CYCLES] == wide.stats[:S_EVICT_CYCLES]).all(), pol
        assert (narrow.stats[S_EVICT_CYCLES + 1:] == wide.stats[S_EVICT_CYCLES + 1:]).all(), pol
    for pol in ("lfu", "s3fifo", "gdsf", "oracle"):  # policy columns or a heap: the full row
        assert Cache(s, pol, capacity).state[0].shape[1] == NUM_ROWS, pol


def test_orphans_are_counted_without_leaf_only() -> None:
    # FIFO, capacity 4: r0 [1]; r1 [1,2] hits 1 and caches 2 -> queue 1,2 (1 entered first); r2 [3,4] fills
    # the cache; r3 [5] evicts the oldest, 1, although its child 2 is cached: one orphaning eviction.
    # r4 [1,2]: 1 misses and its insertion evicts 2 (now the oldest). Hits: 1 (r1).
    s = stream_from_lists([[1], [1, 2], [3, 4], [5], [1, 2]])
    r = simulate_policy(s, "fifo", 4)
    assert (r.num_orphaning_evictions, r.num_parked, r.num_hits) == (1, 0, 1)
    # prefix closure: at r3 FIFO's choice 1 is held back (parked), FIFO is asked again and gives 2; 1 is a
    # leaf then, but one eviction was enough. r4 [1,2] hits the held-back 1; 2 evicts 3. Hits: 2.
    r = simulate_policy(s, "fifo", 4, params={"leaf_only": True})
    assert (r.num_orphaning_evictions, r.num_parked, r.num_hits) == (0, 1, 2)
    assert r.req_hit_blocks.tolist() == [0, 1, 0, 0, 1]


@settings(max_examples=examples(40), deadline=None)
@given(streams(), st.integers(1, 12), st.integers(1, 5))
def test_serving_in_slices_equals_one_pass(s: Stream, capacity: int, slices: int) -> None:
    # The Cache keeps its state between calls: serving the requests in any slicing gives the same hits.
    from tongyi_trace.sim.simulate import Cache

    cuts = sorted({0, s.num_requests, *[(k * s.num_requests) // slices for k in range(slices)]})
    for pol in ALL:
        whole = simulate_policy(s, pol, capacity, fit=FIT)
        cache = Cache(s, pol, capacity, fit=FIT)
        for a, b in itertools.pairwise(cuts):
            cache.serve(a, b)
        part = cache.result()
        assert part.req_hit_blocks.tolist() == whole.req_hit_blocks.tolist(), pol
        assert (part.num_evictions, part.per_category) == (whole.num_evictions, whole.per_category), pol


def test_cached_prefix_is_what_a_router_sees() -> None:
    from tongyi_trace.sim.simulate import Cache

    s = stream_from_lists([[1, 2, 3], [1, 2, 4], [5]])
    cache = Cache(s, "lru", 10)
    assert cache.cached_prefix(1) == 0
    cache.serve(0, 1)
    assert (cache.cached_prefix(1), cache.cached_prefix(2), cache.num_cached) == (2, 0, 3)


@settings(max_examples=examples(60), deadline=None)
@given(streams(), st.integers(1, 12))
def test_wa_in_lru_order_is_lru(s: Stream, capacity: int) -> None:
    # The switch a guard flips (wa.IP_LRU_ORDER): WA's queues then evict exactly as LRU does.
    from tongyi_trace.sim.policies.wa import IP_LRU_ORDER
    from tongyi_trace.sim.simulate import Cache

    cache = Cache(s, "wa", capacity, fit=FIT)
    cache.ip[IP_LRU_ORDER] = 1
    cache.serve(0, s.num_requests)
    assert cache.result().req_hit_blocks.tolist() == simulate_policy(s, "lru", capacity).req_hit_blocks.tolist()


def test_a_child_is_uncounted_only_from_the_parent_that_counted_it() -> None:
    # FIFO, capacity 3: r1 [1,2] counts 2 in 1; r3 [4] evicts 1 (the oldest) under its cached child 2;
    # r4 [1] caches 1 again (a new incarnation, no child) and evicts 2: 2 was counted in the evicted
    # incarnation only, so the new one keeps 0 children (uncounting it would wrap its count below 0).
    s = stream_from_lists([[1], [1, 2], [3], [4], [1]])
    c = Cache(s, "fifo", 3)
    c.serve(0, s.num_requests)
    bk = c.state[0]
    one, two = (int(s.blk[i]) for i in (0, 2))
    assert c.result().num_orphaning_evictions == 1 and bk[two, PRESENT] == 0
    assert nchild(bk, one) == 0 and inserted_at(bk, one) == 5 > inserted_at(bk, two) == 2


def test_a_stream_past_the_insertion_stamps_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stamps take 31 bits (structs.MAX_INSERTIONS); a stream that could insert more is refused up front.
    import tongyi_trace.sim.simulate as sim

    monkeypatch.setattr(sim, "MAX_INSERTIONS", 2)
    with pytest.raises(UsageError, match="at most 2 references; this stream has 3: simulate a shorter window"):
        Cache(stream_from_lists([[1, 2], [3]]), "fifo", 2)
