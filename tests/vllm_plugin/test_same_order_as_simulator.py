"""The plugin's queue and the simulator give the same hits on the same request stream, for every eviction
order the plugin offers (WA, LRU, FIFO, S3-FIFO, and "fitted", which runs one of them).

A minimal model of vLLM's BlockPool prefix caching (longest cached prefix is hit and pinned, the rest
is allocated with popleft_n evicting old content, the request's blocks are released tail first) runs
over the plugin's PolicyFreeQueue on trace time, beside tongyi_trace.sim on the same requests.
Sessions keep one category. With prefix closure (leaf_only: WA's default, an option for the others) no
block stays cached after its parent was evicted; LRU never leaves such blocks either. Where they can
occur (FIFO and S3-FIFO by default, WA with leaf_only off) streams that produce one are left out: vLLM
recomputes such a block in a new block, the simulator reuses the cached copy, which is the engine
model's business, not the eviction order's. Otherwise the two are specified to agree block for block:
WA in every variant (exp and km models, conditional, a life window override, ties from equal
timestamps), LRU, FIFO and S3-FIFO, with and without prefix closure.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.policy.file import CategoryParams, PolicyParams
from tongyi_trace.policy.wa_priority import km_grid_s
from tongyi_trace.vllm_plugin.queue import PolicyFreeQueue
from tongyi_trace.vllm_plugin.settings import QueuePolicy

# km tables: hot is reused late (F rises from 10 s), cold early and flat after 5 s
_HOT_KM = tuple(min(0.8, 0.8 * max(t - 10.0, 0.0) / 60.0) for t in km_grid_s())
_COLD_KM = tuple(min(0.3, 0.3 * t / 5.0) for t in km_grid_s())
PARAMS = {
    "hot": CategoryParams(reuse_prob=0.8, rate_per_s=0.02, mean_reuse_s=50.0, life_s=200.0, km_cdf=_HOT_KM),
    "cold": CategoryParams(reuse_prob=0.2, rate_per_s=0.5, mean_reuse_s=2.0, life_s=5.0, km_cdf=_COLD_KM),
}
VARIANTS: list[dict[str, object]] = [
    {}, {"model": "km"}, {"model": "km", "conditional": True}, {"conditional": True, "life_s": 3.0},
    {"model": "km", "life_s": 30.0}, {"use_offset": False}, {"leaf_only": False},
]
DEFAULT = CategoryParams(reuse_prob=0.5, rate_per_s=0.1, mean_reuse_s=10.0, life_s=30.0)


@dataclass
class Block:
    block_id: int
    block_hash: object = None


class MiniPool:
    """vLLM's prefix-cache bookkeeping (BlockPool + KVCacheManager) for requests served one at a time."""

    def __init__(self, capacity_blocks: int, mode: str, variant: dict[str, object] | None = None,
                 params: dict[str, CategoryParams] = PARAMS) -> None:
        policy = QueuePolicy(mode=mode, categories=dict(params),
                             default=DEFAULT, **(variant or {}))  # type: ignore[arg-type]
        self.queue = PolicyFreeQueue([Block(i) for i in range(capacity_blocks + 1)], policy)
        self.queue.popleft()  # vLLM's null block
        self.cached: dict[int, Block] = {}
        self.num_orphans = 0  # blocks still cached although their parent was evicted


    def serve(self, chain_ids: list[int], category: str, time_s: float, keys: list[int] | None = None) -> int:
        """Serve one request; KEYS: its kv_block_keys (the simulator's ids of its blocks), as kvtrace
        replay sends them."""
        q = self.queue
        q.observe_time(time_s)
        hits: list[Block] = []
        for cid in chain_ids:
            blk = self.cached.get(cid)
            if blk is None:
                break
            hits.append(blk)
        for blk in hits:
            q.remove(blk)
        # cached after the prefix ended: vLLM computes it again in a new block (counted before the
        # allocation below, which may evict that cached copy)
        self.num_orphans += sum(cid in self.cached for cid in chain_ids[len(hits):])
        new = q.popleft_n(len(chain_ids) - len(hits))
        for b in new:
            if b.block_hash is not None and self.cached.get(b.block_hash) is b:  # type: ignore[call-overload]
                del self.cached[b.block_hash]  # type: ignore[arg-type]
            b.block_hash = None
        for b, cid in zip(new, chain_ids[len(hits):], strict=True):
            b.block_hash = cid
            self.cached[cid] = b
        blocks = hits + new
        q.note_request(blocks, category, time_s, keys)
        q.append_n(list(reversed(blocks)))
        return len(hits)


def workload(seed: int, num_sessions: int, max_turns: int, ties: bool = False, shared: bool = False,
             categories: tuple[str, ...] = ("hot", "cold", "other")) -> tuple[list[list[int]], list[float], list[str]]:
    """Interleaved multi-turn sessions: each turn = the previous turn's blocks + 1-4 new ones (TIES:
    times rounded to whole 10 s, so many blocks share a last access; SHARED: most sessions, of any
    category, open with one of two 2-block system prompts, so one prefix serves several categories)."""
    rng = random.Random(seed)
    next_id = 4  # 0-1 and 2-3: the two shared system prompts
    events: list[tuple[float, list[int], str]] = []
    for _ in range(num_sessions):
        cat = rng.choice(categories)
        t = rng.uniform(0, 100)
        blocks: list[int] = rng.choice([[0, 1], [2, 3], []]) if shared else []
        for _ in range(rng.randint(1, max_turns)):
            k = rng.randint(1, 4)
            blocks = blocks + list(range(next_id, next_id + k))
            next_id += k
            events.append((t, list(blocks), cat))
            t += rng.expovariate(1 / 20)
    if ties:
        events = [(10.0 * round(t / 10.0), b, c) for t, b, c in events]
    events.sort(key=lambda e: e[0])
    return [e[1] for e in events], [e[0] for e in events], [e[2] for e in events]


def simulator_ids(requests: list[list[int]]) -> list[list[int]]:
    """The simulator's id of every block of REQUESTS (what kvtrace replay sends as kv_block_keys)."""
    from tongyi_trace.sim.stream import stream_from_lists

    s = stream_from_lists(requests)
    return [s.blk[a:b].tolist() for a, b in zip(s.req_off[:-1], s.req_off[1:], strict=True)]


def plugin_hits(pool: MiniPool, requests: list[list[int]], times: list[float], cats: list[str]) -> list[int]:
    """The hit blocks of each request served through POOL, each sending its kv_block_keys."""
    return [pool.serve(r, c, t, k)
            for r, t, c, k in zip(requests, times, cats, simulator_ids(requests), strict=True)]


def simulated_hits(requests: list[list[int]], times: list[float], cats: list[str], capacity: int,
                   policy: str, variant: dict[str, object] | None = None,
                   params: dict[str, CategoryParams] = PARAMS) -> list[int]:
    from tongyi_trace.sim.simulate import simulate_policy
    from tongyi_trace.sim.stream import stream_from_lists

    stream = stream_from_lists(requests, times_s=times, categories=cats)
    fit = PolicyParams(categories=dict(params), default=DEFAULT) if policy == "wa" else None
    res = simulate_policy(stream, policy, capacity, fit=fit, params=dict(variant or {}), timing=False)
    return [int(x) for x in np.asarray(res.req_hit_blocks)]


CASES: list[tuple[str, dict[str, object]]] = [
    ("lru", {}), *(("wa", v) for v in VARIANTS),
    *((p, v) for p in ("fifo", "s3fifo") for v in ({}, {"leaf_only": True})),
]


def _prefix_closed(policy: str, variant: dict[str, object]) -> bool:
    leaf_only = variant.get("leaf_only", policy == "wa")
    return policy == "lru" or leaf_only is True


# "other" shares "hot"'s model, as categories pooled by the fit do: with TIES their queue heads are exactly
# equal in priority, offset and last access, and only the block key decides
POOLED = {**PARAMS, "other": PARAMS["hot"]}


@settings(max_examples=examples(240), deadline=None)
@given(seed=st.integers(0, 10_000), capacity=st.integers(12, 60), ties=st.booleans(), shared=st.booleans(),
       pooled=st.booleans(), case=st.sampled_from(CASES))
def test_plugin_queue_gives_the_simulators_hits(seed: int, capacity: int, ties: bool, shared: bool, pooled: bool,
                                                case: tuple[str, dict[str, object]]) -> None:
    policy, variant = case
    params = POOLED if pooled else PARAMS
    requests, times, cats = workload(seed, num_sessions=12, max_turns=5, ties=ties, shared=shared)
    assume(max(len(r) for r in requests) <= capacity)
    pool = MiniPool(capacity, policy, variant, params)
    plugin = plugin_hits(pool, requests, times, cats)
    if _prefix_closed(policy, variant):
        assert pool.num_orphans == 0  # prefix closure: a cached block always has its parent
    else:
        # A block cached while its parent was evicted: vLLM recomputes it in a new block, the simulator
        # touches the cached copy; the engine model's business, not the eviction order's.
        assume(pool.num_orphans == 0)
    assert plugin == simulated_hits(requests, times, cats, capacity, policy, variant, params)


def test_pooled_ties_break_by_the_simulators_block_id() -> None:
    """Golden: two pooled categories' heads tie on priority, offset and last access; the simulator's block
    id decides, which the plugin knows only from kv_block_keys (vLLM's block ids come in another order)."""
    requests, times, cats = workload(1, num_sessions=12, max_turns=5, ties=True, shared=True)
    sim = simulated_hits(requests, times, cats, 20, "wa", {}, POOLED)
    pool = MiniPool(20, "wa", {}, POOLED)
    assert plugin_hits(pool, requests, times, cats) == sim
    unkeyed = MiniPool(20, "wa", {}, POOLED)
    assert [unkeyed.serve(r, c, t) for r, t, c in zip(requests, times, cats, strict=True)] != sim


@settings(max_examples=examples(60), deadline=None)
@given(seed=st.integers(0, 10_000), capacity=st.integers(12, 60), ties=st.booleans(),
       variant=st.sampled_from(VARIANTS[:5]))
def test_wa_over_many_categories_gives_the_simulators_hits(seed: int, capacity: int, ties: bool,
                                                          variant: dict[str, object]) -> None:
    """Eleven categories of random parameters (the simulator's tournament tree over the queue heads is
    four levels deep, with empty leaves; the plugin compares the heads one by one). Each category has a
    km table of its own, flat in places: two categories with one table would give heads whose priorities
    are equal in exact arithmetic, which the engine's float times and the simulator's microseconds round
    apart."""
    rng = random.Random(seed)

    def km_table(p: float) -> tuple[float, ...]:
        steps = np.cumsum([rng.choice([0.0, rng.random()]) for _ in km_grid_s()])
        return tuple(float(v) for v in p * steps / max(float(steps[-1]), 1.0))

    params = {}
    for i in range(10):
        p = rng.uniform(0.05, 0.95)
        params[f"c{i}"] = CategoryParams(reuse_prob=p, rate_per_s=rng.uniform(0.01, 2.0), mean_reuse_s=10.0,
                                         life_s=rng.uniform(1.0, 300.0), km_cdf=km_table(p))
    requests, times, cats = workload(seed, num_sessions=30, max_turns=4, ties=ties,
                                     categories=(*params, "unknown"))
    assume(max(len(r) for r in requests) <= capacity)
    pool = MiniPool(capacity, "wa", variant, params)
    plugin = plugin_hits(pool, requests, times, cats)
    assert pool.num_orphans == 0
    assert plugin == simulated_hits(requests, times, cats, capacity, "wa", variant, params)


@pytest.mark.parametrize("chosen", ["lru", "fifo", "s3fifo"])
def test_fitted_mode_runs_the_choice_nearest_the_pool(chosen: str) -> None:
    """Mode "fitted" takes the choice whose capacity is nearest the pool's, with its parameters, and then
    orders as that policy."""
    capacity = 24
    params: dict[str, object] = {"leaf_only": True}
    choices = ((capacity * 16, chosen, params), (capacity * 16 * 8, "wa", {}))
    for seed in range(6):
        requests, times, cats = workload(seed, num_sessions=12, max_turns=5, shared=True)
        pool = MiniPool(capacity, "fitted", {"choices": choices})
        assert (pool.queue.policy.mode, pool.queue.policy.leaf_only) == (chosen, True)
        plugin = plugin_hits(pool, requests, times, cats)
        assert pool.num_orphans == 0
        assert plugin == simulated_hits(requests, times, cats, capacity, chosen, params)


def test_a_fitted_s3fifo_choice_runs_with_its_settings() -> None:
    """S3-FIFO's settings are one type (policy/settings.py, S3FifoSettings) that the simulator and the plugin
    both read: a fitted choice's s3fifo settings reach the plugin's queues (they were once ignored there),
    which then give the simulator's hits with the same settings, and other hits than the defaults'."""
    capacity = 24
    params: dict[str, object] = {"leaf_only": True, "small_ratio": 0.3, "move_to_main_threshold": 2, "freq_cap": 2}
    differs = 0
    for seed in range(6):
        requests, times, cats = workload(seed, num_sessions=12, max_turns=5, shared=True)
        pool = MiniPool(capacity, "fitted", {"choices": ((capacity * 16, "s3fifo", params),)})
        s3 = pool.queue._s3
        assert s3 is not None and (s3.settings.small_ratio, s3.settings.freq_cap) == (0.3, 2)
        plugin = plugin_hits(pool, requests, times, cats)
        assert pool.num_orphans == 0
        assert plugin == simulated_hits(requests, times, cats, capacity, "s3fifo", params)
        differs += plugin != simulated_hits(requests, times, cats, capacity, "s3fifo", {"leaf_only": True})
    assert differs > 0


def test_fifo_and_s3fifo_differ_from_lru_on_these_workloads() -> None:
    """The FIFO and S3-FIFO cases above are not vacuous: on streams they are compared on (no orphan for
    FIFO's default; prefix closure for S3-FIFO) they hit differently from LRU."""
    fifo = s3fifo = 0
    for seed in range(40):
        requests, times, cats = workload(seed, num_sessions=12, max_turns=5)
        if max(len(r) for r in requests) > 16:
            continue
        pool = MiniPool(16, "fifo")
        hits = [pool.serve(r, c, t) for r, t, c in zip(requests, times, cats, strict=True)]
        fifo += pool.num_orphans == 0 and hits != simulated_hits(requests, times, cats, 16, "lru")
    for seed in range(10):
        requests, times, cats = workload(seed, num_sessions=12, max_turns=5, shared=True)
        s3fifo += (simulated_hits(requests, times, cats, 24, "s3fifo", {"leaf_only": True})
                   != simulated_hits(requests, times, cats, 24, "lru"))
    assert fifo > 0 and s3fifo > 0
