"""The two-tier cache (sim/simulate.py TieredCache): HBM over DRAM, exclusive, each tier under its own
policy. Golden streams traced by hand, then properties over random prefix-chained streams."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tests.sim.test_properties import FIT, streams
from tongyi_trace.errors import UsageError
from tongyi_trace.sim.kernel import promote
from tongyi_trace.sim.registry import Policy
from tongyi_trace.sim.simulate import Cache, TieredCache, simulate_policy, simulate_tiered
from tongyi_trace.sim.stream import Stream, stream_from_lists
from tongyi_trace.sim.structs import PRESENT

ALL = [p.value for p in Policy]


def test_golden_prefix_across_both_tiers() -> None:
    # LRU 2 over LRU 3. r0 [1,2]: HBM {1,2} (2 released first: older). r1 [3]: HBM evicts 2 -> DRAM {2}.
    # r2 [1,2,4]: prefix 1 (HBM) + 2 (DRAM, promoted) = 2 hits, 1 of each; 2 goes in by evicting 3 -> DRAM {3};
    # 4 finds HBM full of the pinned 1, 2: not cached. r3 [3,5]: 3 from DRAM (1 hit); 3 and 5 go in by
    # evicting 2 then 1 -> DRAM {2, 1}.
    s = stream_from_lists([[1, 2], [3], [1, 2, 4], [3, 5]], times_s=[0, 1, 2, 3])
    r = simulate_tiered(s, "lru", 5, 2)
    assert r.hbm.req_hit_blocks.tolist() == [0, 0, 2, 1]
    assert r.req_dram_hits.tolist() == [0, 0, 1, 1]
    assert (r.num_hbm_hits, r.num_dram_hits, r.hbm.num_refs) == (1, 2, 8)
    assert r.hbm.num_evictions == 4 and r.num_dram_evictions == 0  # 4 demotions, nothing dropped
    assert r.hbm.num_bypassed == 1
    assert r.req_dram_hit_tokens.tolist() == [0, 0, 16, 16]  # 16 tokens a block (stream_from_lists)


def test_warming_compiles_every_kernel_and_serves_nothing() -> None:
    # warm() runs before the timer (the first run on a machine compiles): it must leave the cache untouched,
    # so the golden case above still comes out the same after it
    s = stream_from_lists([[1, 2], [3], [1, 2, 4], [3, 5]], times_s=[0, 1, 2, 3])
    cache = TieredCache(Cache(s, "lru", 2, timing=False, tiered=True), Cache(s, "lru", 3, timing=False))
    cache.warm()
    cache.hbm._run(0, 0), cache.dram._run(0, 0), cache._demote(0, 0.0)  # what warm() calls when not compiled
    assert cache.hbm.kernel.signatures and cache.demote.signatures and promote.signatures
    for tier in (cache.hbm, cache.dram):
        assert not tier.stats.any() and not tier.state[0][:, PRESENT].any() and tier.elapsed_s == 0
    assert not cache.dram_stats.any()
    cache.serve(0, 4)
    assert cache.hbm.req_hit_blocks.tolist() == [0, 0, 2, 1] and cache.req_dram_hits.tolist() == [0, 0, 1, 1]


def test_golden_lru_over_oracle_keeps_what_lru_drops() -> None:
    # LRU 2 over ORACLE 3, one block a request. r2..r4 demote 1, 2, 3 (DRAM full); r5 [6] demotes 4: room is
    # made first, ORACLE dropping the cached block used farthest ahead, 3 (r8), then 4 enters. r6 [1] and
    # r7 [2] come from DRAM (demoting 5, 6 into the room they leave); r8 [3] misses and demotes 1, ORACLE
    # dropping one of 4, 5, 6 (never used again). One LRU of 5 blocks drops 1 at r5, then 2, 3: no hit.
    s = stream_from_lists([[1], [2], [3], [4], [5], [6], [1], [2], [3]], times_s=list(range(9)))
    r = simulate_tiered(s, "oracle", 5, 2, hbm_policy="lru")
    assert r.req_dram_hits.tolist() == [0] * 6 + [1, 1, 0] and r.num_hbm_hits == 0
    assert r.hbm.num_evictions == 7 and r.num_dram_evictions == 2
    assert simulate_policy(s, "lru", 5).num_hits == 0


def test_golden_fifo_over_lru() -> None:
    # FIFO 2 over LRU 3. r2 [1] hits HBM (FIFO: no reorder); r3 [3] evicts 1, r4 [4] evicts 2 -> DRAM {1,2};
    # r5 [1] from DRAM (evicts 3 -> DRAM {2,3}); r6 [5] evicts 4 -> DRAM {2,3,4}; r7 [2] from DRAM.
    s = stream_from_lists([[1], [2], [1], [3], [4], [1], [5], [2]], times_s=list(range(8)))
    r = simulate_tiered(s, "lru", 5, 2, hbm_policy="fifo")
    assert r.hbm.policy == "fifo" and r.hbm.req_hit_blocks.tolist() == [0, 0, 1, 0, 0, 1, 0, 1]
    assert r.req_dram_hits.tolist() == [0, 0, 0, 0, 0, 1, 0, 1]
    assert (r.num_hbm_hits, r.num_dram_hits) == (1, 2)


def test_tier_sizes_are_checked() -> None:
    s = stream_from_lists([[1, 2]])
    for hbm in (-1, 4, 5):
        with pytest.raises(UsageError, match="the HBM tier needs"):
            simulate_tiered(s, "lru", 4, hbm)


def _max_len(s: Stream) -> int:
    return int(np.diff(s.req_off).max())


@settings(max_examples=examples(60), deadline=None)
@given(streams(), st.integers(1, 12), st.integers(1, 12))
def test_lru_over_a_recency_tier_is_one_lru(s: Stream, hbm: int, dram: int) -> None:
    """LRU over LRU (or FIFO, or LFU: in DRAM a hit always promotes, so they all keep DRAM in demotion
    order) holds what one LRU of H + D blocks holds, HBM what one of H holds (the stack property), for
    every request, when no request outgrows HBM."""
    if _max_len(s) > hbm:
        hbm = _max_len(s)
    whole = simulate_policy(s, "lru", hbm + dram)
    small = simulate_policy(s, "lru", hbm)
    for lower in ("lru", "fifo", "lfu"):
        r = simulate_tiered(s, lower, hbm + dram, hbm, hbm_policy="lru")
        assert np.array_equal(r.hbm.req_hit_blocks, whole.req_hit_blocks), lower
        assert np.array_equal(r.hbm.req_hit_blocks - r.req_dram_hits, small.req_hit_blocks), lower
        assert np.array_equal(r.hbm.req_hit_tokens, whole.req_hit_tokens), lower


@settings(max_examples=examples(40), deadline=None)
@given(streams(), st.integers(1, 8), st.integers(0, 8), st.sampled_from(ALL), st.sampled_from(ALL))
def test_every_pair_of_policies_adds_up_and_stays_exclusive(s: Stream, hbm: int, dram: int, upper: str,
                                                            lower: str) -> None:
    """Any HBM policy over any DRAM policy: HBM + DRAM hits + misses = refs per request; a block is in one
    tier at most and each tier within its size after every request; hits never above the ideal."""
    cache = TieredCache(Cache(s, upper, hbm, fit=FIT, timing=False, tiered=True),
                        Cache(s, lower, dram, fit=FIT, timing=False))
    _serve_checking_each_request(cache, hbm, dram)
    res = cache.result()
    hits, dram_hits = res.hbm.req_hit_blocks, res.req_dram_hits
    lens = np.diff(s.req_off)
    assert (dram_hits >= 0).all() and (dram_hits <= hits).all() and (hits <= lens).all()
    assert res.num_hbm_hits + res.num_dram_hits + (res.hbm.num_refs - res.hbm.num_hits) == s.num_refs
    assert res.hbm.num_hits <= s.ideal_hits()
    assert 0 <= res.num_dram_hit_tokens <= res.hbm.num_hit_tokens


@settings(max_examples=examples(60), deadline=None)
@given(streams(), st.integers(1, 8), st.integers(1, 8))
def test_wa_in_dram_sees_the_blocks_promoted_behind_its_hooks(s: Stream, hbm: int, dram: int) -> None:
    """WA keeps its queue heads' priorities while the time stands still; promote takes blocks out of its
    queues behind its hooks (kernel.promote bumps structs.G_EPOCH). With every request at one instant a
    head promoted to HBM must not be WA's next victim: each tier stays within its size, exclusive, and its
    count of cached blocks true."""
    lens = np.diff(s.req_off)
    same = stream_from_lists([s.blk[a:a + n].tolist() for a, n in zip(s.req_off[:-1], lens, strict=True)],
                             times_s=[0.0] * s.num_requests, categories=[s.categories[c] for c in s.req_cat])
    _serve_checking_each_request(TieredCache(Cache(same, "lru", hbm, timing=False, tiered=True),
                                             Cache(same, "wa", dram, fit=FIT, timing=False)), hbm, dram)


def _serve_checking_each_request(cache: TieredCache, hbm: int, dram: int) -> None:
    """Serve every request one at a time; after each, a block is in one tier at most and each tier's count
    of cached blocks is true and within its size."""
    s = cache.stream
    for r in range(s.num_requests):
        cache.serve(r, r + 1)
        in_hbm = cache.hbm.state[0][: s.num_ids, PRESENT] == 1
        in_dram = cache.dram.state[0][: s.num_ids, PRESENT] == 1
        assert not (in_hbm & in_dram).any()
        assert in_hbm.sum() == cache.hbm.num_cached <= hbm and in_dram.sum() == cache.dram.num_cached <= dram
        assert cache.cached_prefix(r) >= 0


@settings(max_examples=examples(40), deadline=None)
@given(streams(), st.integers(1, 8), st.integers(1, 8), st.sampled_from(ALL))
def test_with_lru_in_hbm_the_dram_tier_only_adds(s: Stream, hbm: int, dram: int, lower: str) -> None:
    """With vLLM's LRU on HBM, HBM hits are exactly an LRU of H blocks' whatever DRAM runs (HBM stays
    prefix-closed, so the promoted blocks change nothing in its order): the two tiers never hit less than
    HBM alone, per request."""
    small = simulate_policy(s, "lru", hbm)
    r = simulate_tiered(s, lower, hbm + dram, hbm, hbm_policy="lru", fit=FIT)
    assert np.array_equal(r.hbm.req_hit_blocks - r.req_dram_hits, small.req_hit_blocks)
    assert (r.hbm.req_hit_blocks >= small.req_hit_blocks).all()


def test_no_bound_by_one_cache_of_either_policy() -> None:
    """The two tiers' hit ratio is bounded by neither policy's single cache of the whole size: LRU over
    ORACLE hits where one LRU of 5 blocks does not (golden above), LRU over FIFO (one LRU of 3 blocks,
    above) keeps the hot block 1 that one FIFO of 3 blocks drops at r4."""
    s = stream_from_lists([[1], [2], [3], [4], [5], [6], [1], [2], [3]], times_s=list(range(9)))
    assert simulate_tiered(s, "oracle", 5, 2, hbm_policy="lru").num_dram_hits > simulate_policy(s, "lru", 5).num_hits
    s = stream_from_lists([[1], [2], [3], [1], [4], [1], [5], [1]], times_s=list(range(8)))
    assert simulate_tiered(s, "fifo", 3, 2, hbm_policy="lru").hbm.num_hits == 3
    assert simulate_policy(s, "fifo", 3).num_hits == 2


def test_plain_cache_refuses_a_tiered_pairing_of_two_streams() -> None:
    a, b = stream_from_lists([[1]]), stream_from_lists([[1]])
    with pytest.raises(ValueError, match="same stream"):
        TieredCache(Cache(a, "lru", 1, tiered=True), Cache(b, "lru", 1))
    with pytest.raises(ValueError, match="tiered HBM"):
        TieredCache(Cache(a, "lru", 1), Cache(a, "lru", 1))


def test_a_tiered_cache_is_no_dram_tier() -> None:
    s = stream_from_lists([[1, 2], [3]])
    with pytest.raises(ValueError, match="untiered DRAM cache"):
        TieredCache(Cache(s, "lru", 1, tiered=True), Cache(s, "lru", 2, tiered=True))
