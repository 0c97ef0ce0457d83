"""The fleet simulator: one instance equals the single-instance simulation for every policy and tier
setting, golden routing and duplication on hand-made streams, router parameters and errors; caches reused
between simulations (CachePool) are back in their initial state and give the same results."""

from __future__ import annotations

import numpy as np
import pytest

from tongyi_trace.errors import UsageError
from tongyi_trace.fleet.routers import ROUTERS, get_router, parse_routers
from tongyi_trace.fleet.routers.session import SessionAffinity
from tongyi_trace.fleet.simulate import CachePool, Tiers, simulate_fleet
from tongyi_trace.policy.file import CategoryParams, PolicyParams
from tongyi_trace.sim.cost_model import CostModel, qttft_s, summarize_qttft
from tongyi_trace.sim.registry import REGISTRY
from tongyi_trace.sim.simulate import Cache, simulate_policy, simulate_tiered
from tongyi_trace.sim.stream import next_request_of_refs, stream_from_lists

COST = CostModel("test", overhead_s=0.01, s_per_token=0.001, s_per_loaded_token=0.0002)
FIT = PolicyParams(categories={"a": CategoryParams(0.9, 1.0, 1.0, 10.0)}, default=CategoryParams(0.1, 0.1, 10.0, 10.0))


def _stream(seed: int, n: int = 60):
    """Prefix-chained requests: conversations that grow by turns, over a few shared system prompts."""
    rng = np.random.default_rng(seed)
    reqs: list[list[int]] = []
    convs: list[list[int]] = []
    nxt = 1000
    for _ in range(n):
        if convs and rng.random() < 0.6:
            c = convs[int(rng.integers(len(convs)))]
        else:
            c = [int(rng.integers(3))]  # one of three system prompts
            convs.append(c)
        grow = int(rng.integers(1, 4))
        c.extend(range(nxt, nxt + grow))
        nxt += grow
        reqs.append(list(c))
    cats = ["a" if rng.random() < 0.5 else "b" for _ in reqs]
    times = np.cumsum(rng.exponential(0.05, n)).tolist()
    return stream_from_lists(reqs, times_s=times, categories=cats)


@pytest.mark.parametrize("policy", [p.value for p in REGISTRY])
@pytest.mark.parametrize("hbm", [None, 3])
def test_one_instance_equals_single_simulation(policy: str, hbm: int | None) -> None:
    stream = _stream(1)
    nxt = next_request_of_refs(stream.req_off, stream.blk, stream.num_ids)
    cap = 12
    one = simulate_fleet(stream, "rr", 1, policy, cap, fit=FIT, next_req=nxt, tiers=Tiers(hbm_blocks=hbm), cost=COST)
    ref = simulate_policy(stream, policy, cap, fit=FIT, next_req=nxt)
    assert 0 < ref.num_hits < stream.ideal_hits()  # the capacity really evicts
    hit_tok, loaded = ref.req_hit_tokens, None
    if hbm is None:
        assert one.num_hits == ref.num_hits and np.array_equal(one.req_hit_blocks, ref.req_hit_blocks)
    else:  # the two-tier cache (sim/simulate.py) of the same sizes
        tiers = simulate_tiered(stream, policy, cap, hbm, fit=FIT, next_req=nxt)
        assert np.array_equal(one.req_hit_blocks, tiers.hbm.req_hit_blocks)
        assert (one.num_hbm_hits, one.num_dram_hits) == (tiers.num_hbm_hits, tiers.num_dram_hits)
        assert one.num_dram_hits > 0
        hit_tok, loaded = tiers.hbm.req_hit_tokens, tiers.req_dram_hit_tokens
    assert one.num_hit_tokens == int(hit_tok.sum())
    q = qttft_s(COST, stream.req_time_s, stream.req_tokens - hit_tok, loaded)
    assert one.qttft == summarize_qttft(q)  # exactly, not approximately
    assert one.duplication == 0.0 and one.requests_per_instance == [stream.num_requests]


def test_golden_routing_two_instances() -> None:
    # r0 [1,2] r1 [5,6] r2 [1,2,3] r3 [5,6,7]: rr splits the conversations, prefix follows them
    stream = stream_from_lists([[1, 2], [5, 6], [1, 2, 3], [5, 6, 7]], times_s=[0, 10, 20, 30])
    rr = simulate_fleet(stream, "rr", 2, "lru", 10, cost=COST)
    assert rr.req_instance.tolist() == [0, 1, 0, 1] and rr.num_hits == 4
    ll = simulate_fleet(stream, "least-loaded", 2, "lru", 10, cost=COST)  # idle fleet: fewest routed, then index
    assert ll.req_instance.tolist() == [0, 1, 0, 1]
    pre = simulate_fleet(stream, "prefix", 2, "lru", 10, cost=COST)
    assert pre.req_instance.tolist() == [0, 1, 0, 1] and pre.num_hits == 4
    # rr that crosses the conversations: r2 lands where [1,2] is not, and misses
    crossed = stream_from_lists([[1, 2], [1, 2, 3], [5, 6], [5, 6, 7]], times_s=[0, 10, 20, 30])
    assert simulate_fleet(crossed, "rr", 2, "lru", 10, cost=COST).num_hits == 0
    assert simulate_fleet(crossed, "prefix", 2, "lru", 10, cost=COST).num_hits == 4
    assert simulate_fleet(crossed, "oracle-affinity", 2, "lru", 10, cost=COST).num_hits == 4
    assert simulate_fleet(crossed, "kv-aware", 2, "lru", 10, cost=COST).num_hits == 4


def test_duplication_and_utilization_golden() -> None:
    stream = stream_from_lists([[1, 2], [1, 2]], times_s=[0.0, 10.0])
    res = simulate_fleet(stream, "rr", 2, "lru", 10, cost=COST)
    # samples after r0 (2 held, none twice) and after r1 (2 held, both twice)
    assert res.duplication == 2 / 4
    service = COST.overhead_s + COST.s_per_token * 32
    assert res.utilization == pytest.approx([service / 10.0, service / 10.0])
    assert res.imbalance == pytest.approx(1.0)
    assert res.qttft["qttft_p99_s"] == pytest.approx(service)


def test_session_router_sticks_and_rebalances() -> None:
    sess = SessionAffinity({"vnodes": "16"})
    homes = {s: sess.home(s, 4) for s in range(200)}
    assert set(homes.values()) == {0, 1, 2, 3}
    # consistent hashing: growing the ring from 4 to 5 instances moves only sessions onto the new one
    grown = SessionAffinity({"vnodes": "16"})
    moved = [s for s in range(200) if grown.home(s, 5) != homes[s]]
    assert moved and all(grown.home(s, 5) == 4 for s in moved)
    # one conversation of many turns arriving at once: sticky until its instance is SATURATION_S ahead
    reqs = [[1, *range(100, 100 + k)] for k in range(1, 9)]
    stream = stream_from_lists(reqs, times_s=[0.0] * 8)
    session = np.zeros(8, np.int64)
    sticky = simulate_fleet(stream, "session:saturation_s=100", 2, "lru", 100, cost=COST, session=session)
    assert len(set(sticky.req_instance.tolist())) == 1
    moving = simulate_fleet(stream, "session:saturation_s=0.05", 2, "lru", 100, cost=COST, session=session)
    assert len(set(moving.req_instance.tolist())) == 2


def test_remote_pool_and_one_tier() -> None:
    stream = _stream(2)
    base = simulate_fleet(stream, "rr", 4, "lru", 10, cost=COST)
    one_tier = simulate_fleet(stream, "rr", 4, "lru", 10, cost=COST, tiers=Tiers(hbm_blocks=10))
    assert one_tier.summary() | {"elapsed_s": 0} == base.summary() | {"elapsed_s": 0}
    pooled = simulate_fleet(stream, "rr", 4, "lru", 10, cost=COST,
                            tiers=Tiers(remote_blocks=10_000, remote_s_per_token=0.0))
    assert pooled.num_hits == stream.ideal_hits()  # the shared pool remembers everything
    assert pooled.num_remote_hits == pooled.num_hits - base.num_hits > 0


def test_router_specs_and_errors() -> None:
    assert parse_routers("all") == ["rr", "least-loaded", "session", "prefix", "kv-aware", "oracle-affinity"]
    assert get_router("kv-aware:weight=2.5").weight == 2.5  # type: ignore[attr-defined]
    for spec, msg in [("belady", "unknown router"), ("kv-aware:alpha=1", "no parameter 'alpha'"),
                      ("kv-aware:weight=x", "is not a float"), ("kv-aware:weight", "NAME:KEY=VALUE"),
                      ("kv-aware:weight=-1", ">= 0")]:
        with pytest.raises(UsageError, match=msg):
            get_router(spec)
    with pytest.raises(UsageError, match="at least 1"):
        simulate_fleet(_stream(3, 5), "rr", 0, "lru", 4, cost=COST)


def test_memory_check_names_what_to_do() -> None:
    from tongyi_trace.fleet.sweep import check_memory
    from tongyi_trace.sim.capacity import Capacity

    task = ("lru", "lru", {}, "rr", 4, Capacity("5%", 100))
    check_memory([task], 1000, Tiers(), 1)  # 4 tables of 1,001 ids: nothing to refuse
    msg = r"4 caches of 10,000,000,000,000 distinct blocks x 1 workers.*fewer --instances"
    with pytest.raises(UsageError, match=msg):
        check_memory([task], 10**13, Tiers(), 1)

@pytest.mark.parametrize("policy", [p.value for p in REGISTRY])
def test_a_returned_cache_is_in_its_initial_state(policy: str) -> None:
    stream = _stream(3, n=80)
    nxt = next_request_of_refs(stream.req_off, stream.blk, stream.num_ids)
    pool = CachePool()
    res = simulate_fleet(stream, "prefix", 3, policy, 9, fit=FIT, next_req=nxt, cost=COST, pool=pool,
                         tiers=Tiers(hbm_blocks=4, remote_blocks=15))
    assert res.num_hits > 0
    kept = [c for free in pool.free.values() for c, _ in free]
    # 3 HBM + 3 DRAM + the remote pool, and the router's LRU index (its own with two tiers)
    assert len(kept) == 10 and not pool.lent
    for cache in kept:
        new = Cache(stream, cache.spec.name, cache.capacity_blocks, params=cache.params, fit=FIT, next_req=nxt,
                    timing=False)
        for got, want in zip(cache.state, new.state, strict=True):
            assert np.array_equal(got, want, equal_nan=True)
        assert not cache.stats.any() and not cache.req_hit_tokens.any()


@pytest.mark.parametrize("policy", ["lru", "wa", "s3fifo", "gdsf"])
def test_reused_caches_give_the_same_results(policy: str) -> None:
    stream = _stream(4, n=90)
    pool = CachePool()
    tiers = Tiers(hbm_blocks=5)
    for router in ROUTERS:
        for n in (3, 2):  # the 2-instance fleet takes two of the three returned caches
            new = simulate_fleet(stream, router, n, policy, 11, fit=FIT, cost=COST, tiers=tiers)
            reused = simulate_fleet(stream, router, n, policy, 11, fit=FIT, cost=COST, tiers=tiers, pool=pool)
            assert np.array_equal(reused.req_instance, new.req_instance), router
            assert np.array_equal(reused.req_hit_blocks, new.req_hit_blocks), router
            assert (reused.num_hbm_hits, reused.duplication) == (new.num_hbm_hits, new.duplication)
    assert sum(len(v) for v in pool.free.values()) == 9  # 3 HBM, 3 DRAM, 3 for the router's LRU index


@pytest.mark.parametrize("policy", [p.value for p in REGISTRY])
def test_the_queue_walk_counts_the_cached_blocks_as_the_table_scan_does(policy: str) -> None:
    from tongyi_trace.fleet.simulate import _add_present, _add_queued
    from tongyi_trace.sim.structs import G_SIZE

    stream = _stream(6, n=80)
    nxt = next_request_of_refs(stream.req_off, stream.blk, stream.num_ids)
    walked, scanned = np.zeros(stream.num_ids, np.int8), np.zeros(stream.num_ids, np.int8)
    caches = [Cache(stream, policy, 10 + 3 * i, fit=FIT, next_req=nxt, timing=False) for i in range(3)]
    for c in caches:
        c.serve(0, stream.num_requests)
        bk, _, g, _, qs, _ = c.state
        assert 0 < g[G_SIZE] <= c.capacity_blocks
        if not _add_queued(walked, bk, qs, int(g[G_SIZE])):
            assert policy not in ("lru", "fifo")  # their queues hold every cached block
            _add_present(walked, bk)
        _add_present(scanned, bk)
    assert np.array_equal(walked, scanned) and (scanned == 2).sum() > 0


def test_sweep_tasks_share_caches_per_configuration_and_keep_every_worker_busy() -> None:
    from tongyi_trace.fleet.sweep import task_groups
    from tongyi_trace.sim.capacity import Capacity

    routers = ["rr", "least-loaded", "session", "prefix", "kv-aware", "oracle-affinity"]
    caps = [Capacity("1%", 10), Capacity("5%", 50)]
    tasks = [("lru", "lru", {}, rt, n, cap) for cap in caps for rt in routers for n in (2, 8)]
    groups = task_groups(tasks, workers=2)
    assert len(groups) == 4 and all(len(g) == 6 for g in groups)  # 4 configurations >= 2 workers: whole
    assert [(g[0][4], g[0][5].label) for g in groups] == [(8, "5%"), (8, "1%"), (2, "5%"), (2, "1%")]
    assert all(len({(t[4], t[5].label) for t in g}) == 1 for g in groups)
    one = [t for t in tasks if t[4] == 8 and t[5].label == "5%"]
    split = task_groups(one, workers=4)  # one configuration, 4 workers: 4 parts of its 6 routers
    assert sorted(len(g) for g in split) == [1, 1, 2, 2]
    assert sorted(t[3] for g in split for t in g) == sorted(routers)


def test_the_hbm_tier_runs_its_own_policy() -> None:
    """Tiers(hbm_policy="lru"): HBM runs LRU (vLLM's), DRAM the instance's policy, demoted blocks entering
    its order: one instance is the two-tier cache, and its HBM hits are an LRU of H blocks' (HBM stays
    prefix-closed whatever DRAM runs), while the totals depend on DRAM's policy."""
    stream = _stream(1)
    nxt = next_request_of_refs(stream.req_off, stream.blk, stream.num_ids)
    lru = simulate_policy(stream, "lru", 4)
    totals = set()
    for policy in ("fifo", "wa", "s3fifo", "gdsf", "oracle"):
        one = simulate_fleet(stream, "rr", 1, policy, 12, fit=FIT, next_req=nxt, cost=COST,
                             tiers=Tiers(hbm_blocks=4, hbm_policy="lru"))
        ref = simulate_tiered(stream, policy, 12, 4, hbm_policy="lru", fit=FIT, next_req=nxt)
        assert one.policy == policy and np.array_equal(one.req_hit_blocks, ref.hbm.req_hit_blocks), policy
        assert one.num_hbm_hits == lru.num_hits and one.num_dram_hits == ref.num_dram_hits, policy
        totals.add(one.num_hits)
    assert len(totals) >= 2  # the DRAM tier's policy matters on this stream


def test_prefix_router_sees_both_tiers() -> None:
    """The prefix router sees both tiers: r2 [1,2,3] follows [1,2] to instance 0 (both in its HBM); in
    `deep`, r2 [5,6] pushes [1,2] into instance 0's DRAM, and r3 [1,2,3] still goes there and hits both
    blocks from DRAM."""
    stream = stream_from_lists([[1, 2], [5, 6], [1, 2, 3]], times_s=[0, 10, 20])
    pre = simulate_fleet(stream, "prefix", 2, "lru", 4, cost=COST, tiers=Tiers(hbm_blocks=2))
    assert pre.req_instance.tolist() == [0, 1, 0] and pre.num_hits == 2
    assert pre.num_hbm_hits == 2 and pre.num_dram_hits == 0
    deep = stream_from_lists([[1, 2], [7, 8], [5, 6], [1, 2, 3]], times_s=[0, 10, 20, 30])
    one = simulate_fleet(deep, "prefix", 2, "lru", 4, cost=COST, tiers=Tiers(hbm_blocks=2))
    assert one.req_instance.tolist() == [0, 1, 0, 0] and one.num_dram_hits == 2 and one.num_hbm_hits == 0




def test_prefix_equals_oracle_affinity_only_with_lru() -> None:
    """`prefix` routes by its index of routed prompts, aged LRU at each instance's size; with LRU instances that
    index is the caches themselves (fleet/simulate.py shares them), so it decides as `oracle-affinity` does,
    row for row (the identical rows of `simulate --router all` on a to-B trace). Under FIFO the caches evict
    what the index keeps: r5 finds [11,12] still indexed on instance 0 but gone from its FIFO cache, and the
    two routers part (here prefix hits more: the per-request best is not the best over the trace)."""
    reqs = [[11, 12], [11, 12, 13], [1, 2], [1, 2], [21, 22], [11, 12, 13], [11, 12, 13], [1, 2]]
    stream = stream_from_lists(reqs, times_s=list(range(0, 80, 10)))
    lru = [simulate_fleet(stream, r, 2, "lru", 3, cost=COST) for r in ("prefix", "oracle-affinity")]
    assert lru[0].req_instance.tolist() == lru[1].req_instance.tolist() and lru[0].num_hits == lru[1].num_hits
    pre, ora = (simulate_fleet(stream, r, 2, "fifo", 3, cost=COST) for r in ("prefix", "oracle-affinity"))
    assert pre.req_instance.tolist() == [0, 0, 1, 1, 0, 0, 0, 1]
    assert ora.req_instance.tolist() == [0, 0, 1, 1, 0, 1, 1, 0]
    assert (pre.num_hits, ora.num_hits) == (9, 7)
