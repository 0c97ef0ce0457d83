"""Golden hit counts per policy on tiny streams, computed by hand (the derivation is in each comment)."""

from __future__ import annotations

import pytest

from tongyi_trace.policy.file import CategoryParams, PolicyParams
from tongyi_trace.sim.policies.wa import CW_P
from tongyi_trace.sim.simulate import Cache, simulate_policy
from tongyi_trace.sim.stream import stream_from_lists

# r0 [1,2]; r1 [3]; r2 [1,2]; r3 [4]; r4 [3]; capacity 3 blocks; 7 references.
FIXTURE_A = [[1, 2], [3], [1, 2], [4], [3]]


@pytest.mark.parametrize(("policy", "hits", "evictions"), [
    # LRU (oldest first): r0 -> 2,1 (tail released first); r1 -> 2,1,3; r2 hits 1,2 -> 3,2,1;
    # r3 evicts 3 -> 2,1,4; r4 misses 3, evicts 2. Hits: 2 (r2).
    ("lru", 2, 2),
    # FIFO: queue 2,1,3 after r1; r2 hits 1,2 without reordering; r3 evicts 2 -> 1,3,4; r4 hits 3. Hits 3.
    ("fifo", 3, 1),
    # LFU (count, then recency): r2 makes 1,2 count 2; r3 evicts 3 (count 1); r4 misses 3 and evicts
    # 4 (count 1, the only one). Hits 2.
    ("lfu", 2, 2),
    # S3-FIFO (small target 1, ghost 2, threshold 1): r3 finds S = 2,1,3: 2 and 1 were hit -> moved to M,
    # 3 evicted to the ghost; r4: 3 is in the ghost -> goes to M, S = [4] is over target: 4 evicted. Hits 2.
    ("s3fifo", 2, 2),
    # GDSF: cost/size = 1 + (16 pos + 8) / 32768. r2 lifts 1,2 to 2x their cost; r3 evicts 3 (H = 1.000244,
    # clock L = 1.000244), 4 gets H = L + 1.000244 = 2.000488 = H(1); r4 evicts 1 (older stamp), and
    # keeps 2. Hits 2.
    ("gdsf", 2, 2),
    # ORACLE: at r3, 1 and 2 are never used again, 3 is used at r4: evict 2 (the deeper, released first);
    # r4 hits 3. Hits 3.
    ("oracle", 3, 1),
])
def test_fixture_a(policy: str, hits: int, evictions: int) -> None:
    res = simulate_policy(stream_from_lists(FIXTURE_A), policy, 3)
    assert (res.num_refs, res.num_hits, res.num_evictions) == (7, hits, evictions)


def test_fixture_a_hit_tokens_and_per_request() -> None:
    res = simulate_policy(stream_from_lists(FIXTURE_A), "fifo", 3)
    assert res.req_hit_blocks.tolist() == [0, 0, 2, 0, 1]
    assert res.num_hit_tokens == 3 * 16 and res.num_tokens == 7 * 16


def test_block_cached_after_a_miss_is_a_miss() -> None:
    # FIFO, capacity 2: r0 [1]; r1 [1,2] (1 hit, 2 inserted after 1) -> queue 1,2; r2 [3] evicts 1 -> 2,3;
    # r3 [1,2]: 1 misses and its insertion evicts the queue head, 2 (not pinned: not part of the hit, as in
    # vLLM, whose allocation may reuse it), then 2 misses and evicts 3. Hits 1 (r1), evictions 3.
    res = simulate_policy(stream_from_lists([[1], [1, 2], [3], [1, 2]]), "fifo", 2)
    assert (res.num_hits, res.num_touched_misses, res.num_evictions) == (1, 0, 3)
    # GDSF on fixture A then r5 [1,2]: after r4 the cache is {2, 4, 3} (1 was evicted, see test_fixture_a);
    # r5: 1 misses and evicts the lowest H, 4 (2.000488; 2 has 2.001465, 3 has 3.000732); 2 is cached but
    # its prefix was not: counted a miss ("touched"), pinned and refreshed.
    res = simulate_policy(stream_from_lists([*FIXTURE_A, [1, 2]]), "gdsf", 3)
    assert (res.num_refs, res.num_hits, res.num_touched_misses, res.num_evictions) == (9, 2, 1, 3)


def test_request_larger_than_the_cache_caches_its_head() -> None:
    # capacity 2: r0 [1,2,3] caches 1,2 (3 bypassed: everything else is pinned); r1 hits 1,2.
    res = simulate_policy(stream_from_lists([[1, 2, 3], [1, 2, 3]]), "lru", 2)
    assert (res.num_hits, res.num_bypassed) == (2, 2)


def _wa_fit() -> PolicyParams:
    # a: likely and soon reused; b: rarely reused.
    return PolicyParams(categories={"a": CategoryParams(0.9, 1.0, 1.0, 10.0),
                                    "b": CategoryParams(0.1, 0.01, 100.0, 10.0)},
                        default=CategoryParams(0.5, 0.1, 10.0, 10.0))


def test_wa_evicts_the_unlikely_category_first() -> None:
    # capacity 2: r0 (a, t=0) [1]; r1 (b, t=1) [2]; r2 (a, t=2) [3] must evict one of the queue heads:
    #   a: 0.9 e^-2 (1 - e^-10) = 0.122, b: 0.1 e^-0.01 (1 - e^-0.1) = 0.0094 -> evict 2 (LRU would evict 1);
    # r3 (b, t=3) [1] hits under WA, misses under LRU.
    s = stream_from_lists([[1], [2], [3], [1]], times_s=[0, 1, 2, 3], categories=["a", "b", "a", "b"])
    wa = simulate_policy(s, "wa", 2, fit=_wa_fit())
    lru = simulate_policy(s, "lru", 2)
    assert wa.req_hit_blocks.tolist() == [0, 0, 0, 1]
    assert lru.num_hits == 0
    assert wa.per_category["b"]["num_hits"] == 1 and wa.per_category["a"]["num_hits"] == 0


def test_wa_offset_breaks_ties_deepest_first() -> None:
    # capacity 5, categories a and b both unknown to the fit (same default parameters), all at t=0:
    # r0 (a) [1,2] -> queue a: 2, 1; r1 (b) [3,4,5] -> queue b: 5, 4, 3. r2 (a) [6] evicts one of the heads
    # 2 (offset 1) and 5 (offset 2), whose priorities are equal: with the offset key the deeper, 5, goes and
    # r3 (a) [1,2] hits both blocks; without it the next key (last access) ties too and the smaller block id
    # (2, dense id 1; 5 is dense id 4) goes, so r3 hits only 1.
    s = stream_from_lists([[1, 2], [3, 4, 5], [6], [1, 2]], times_s=[0, 0, 0, 0], categories=["a", "b", "a", "a"])
    fit = PolicyParams(categories={}, default=CategoryParams(0.5, 0.1, 10.0, 10.0))
    assert simulate_policy(s, "wa", 5, fit=fit).req_hit_blocks.tolist() == [0, 0, 0, 2]
    assert simulate_policy(s, "wa", 5, fit=fit, params={"use_offset": False}).req_hit_blocks.tolist() == [0, 0, 0, 1]


def test_wa_unknown_category_uses_default() -> None:
    # capacity 2: r0 (a, t=0) [1]; r1 (c, t=1) [2]; r2 (a, t=2) [3] evicts a head. "c" is unknown to the fit,
    # so it takes `default` (p 0.5, rate 0.1): ReuseProb = 0.5 e^-0.1 (1 - e^-1) = 0.286 against a's
    # 0.9 e^-2 (1 - e^-10) = 0.122 -> 1 goes and r3 (c, t=3) [2] hits. Had "c" been given b's parameters
    # (0.1 e^-0.01 (1 - e^-0.1) = 0.0094) or nothing, 2 would have gone.
    s = stream_from_lists([[1], [2], [3], [2]], times_s=[0, 1, 2, 3], categories=["a", "c", "a", "c"])
    assert simulate_policy(s, "wa", 2, fit=_wa_fit()).req_hit_blocks.tolist() == [0, 0, 0, 1]
    as_b = PolicyParams(categories={**_wa_fit().categories, "c": _wa_fit().categories["b"]},
                        default=_wa_fit().default)
    assert simulate_policy(s, "wa", 2, fit=as_b).req_hit_blocks.tolist() == [0, 0, 0, 0]


def test_wa_follows_parameters_a_driver_changed_at_the_same_instant() -> None:
    # The online refit writes new parameters between slices (Cache.cw, then Cache.changed); WA must order by
    # them even when the next request comes at the same time as the last eviction, whose priorities it
    # keeps. All at t=0, capacity 3, same rate and window (0.1/s, 10 s) so p decides: r0 (a) [1]; r1 (b) [2];
    # r2 (b) [3]; r3 (a) [4] evicts b's head 2 (p 0.1 < a's 0.9). Then p becomes a 0.5, b 0.7: r4 (b) [5]
    # evicts a's head 1 (with a's old 0.9 kept, b's 3 would go), and r5 (b) [3] hits.
    s = stream_from_lists([[1], [2], [3], [4], [5], [3]], times_s=[0] * 6,
                          categories=["a", "b", "b", "a", "b", "b"])
    fit = PolicyParams(categories={"a": CategoryParams(0.9, 0.1, 10.0, 10.0),
                                   "b": CategoryParams(0.1, 0.1, 10.0, 10.0)},
                       default=CategoryParams(0.5, 0.1, 10.0, 10.0))
    cache = Cache(s, "wa", 3, fit=fit)
    cache.serve(0, 4)
    cache.cw[CW_P, s.categories.index("a")] = 0.5
    cache.cw[CW_P, s.categories.index("b")] = 0.7
    cache.changed()
    cache.serve(4, 6)
    assert cache.req_hit_blocks.tolist() == [0, 0, 0, 0, 0, 1]


def test_wa_km_model_golden() -> None:
    # The km model reads each category's Kaplan-Meier table. capacity 2: r0 (a, t=0) [1]; r1 (b, t=0) [2];
    # r2 (a, t=10) [3] evicts a head. a's table says reuse happens between 0 and 5 s (F: 0 -> 0.8 by 5 s, then
    # flat): at t=10 a block of a is dead (-inf). b's says reuse comes late (F rises from 20 s to 0.5 at 60 s):
    # b's block is alive (life 100 s: F(110) - F(10) = 0.5) -> 1 (category a) goes, and r3 (b, t=30) [2]
    # hits. The exponential model with these categories' p and rate (a: 0.8, fast; b: 0.5, slow) agrees.
    from tongyi_trace.policy.wa_priority import km_grid_s

    a_km = tuple(min(0.8, 0.8 * t / 5.0) for t in km_grid_s())
    b_km = tuple(min(0.5, 0.5 * max(t - 20.0, 0.0) / 40.0) for t in km_grid_s())
    fit = PolicyParams(categories={"a": CategoryParams(0.8, 1.0, 1.0, 100.0, km_cdf=a_km),
                                   "b": CategoryParams(0.5, 0.02, 50.0, 100.0, km_cdf=b_km)},
                       default=CategoryParams(0.5, 0.1, 10.0, 10.0))
    s = stream_from_lists([[1], [2], [3], [2]], times_s=[0, 0, 10, 30], categories=["a", "b", "a", "b"])
    for params in ({"model": "km"}, {"model": "km", "conditional": True}, {"model": "exp"}):
        assert simulate_policy(s, "wa", 2, fit=fit, params=params).req_hit_blocks.tolist() == [0, 0, 0, 1], params
    # a trace where the two models disagree: b's block at t=10 under the exp model (rate 0.02) is worth
    # 0.5 e^-0.2 (1 - e^-2) = 0.354 and a's block (rate 1, p 0.8) 0.8 e^-10 ~ 4e-5: 1 goes (as above). Swap
    # the tables' meaning by giving a a late km table: km keeps a's block (F rises after 20 s) and drops b's
    # (b's early table is dead at t=10), exp (unchanged p, rate) still drops a's.
    swapped = PolicyParams(categories={"a": CategoryParams(0.8, 1.0, 1.0, 100.0, km_cdf=b_km),
                                       "b": CategoryParams(0.5, 0.02, 50.0, 100.0, km_cdf=a_km)},
                           default=CategoryParams(0.5, 0.1, 10.0, 10.0))
    s2 = stream_from_lists([[1], [2], [3], [1]], times_s=[0, 0, 10, 30], categories=["a", "b", "a", "a"])
    assert simulate_policy(s2, "wa", 2, fit=swapped, params={"model": "km"}).req_hit_blocks.tolist() == [0, 0, 0, 1]
    assert simulate_policy(s2, "wa", 2, fit=swapped, params={"model": "exp"}).req_hit_blocks.tolist() == [0, 0, 0, 0]


def test_wa_without_params_is_a_usage_error() -> None:
    from tongyi_trace.errors import UsageError

    with pytest.raises(UsageError, match="--policy-file"):
        simulate_policy(stream_from_lists([[1]]), "wa", 1)


def test_unknown_parameter_is_an_error() -> None:
    from tongyi_trace.errors import UsageError

    with pytest.raises(UsageError, match="unknown parameter"):
        simulate_policy(stream_from_lists([[1]]), "s3fifo", 1, params={"smal_ratio": 0.2})
    with pytest.raises(UsageError, match="must be float"):
        simulate_policy(stream_from_lists([[1]]), "s3fifo", 1, params={"small_ratio": "lots"})
