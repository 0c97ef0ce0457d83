"""Each policy owns its share of the simulator state (policy_base.StateDecl, its init hook); the heap the
GDSF and ORACLE policies share keeps its documented order; the registry names a colour for every policy."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from tongyi_trace.sim.policies import gdsf
from tongyi_trace.sim.policy_base import InitContext, StateDecl
from tongyi_trace.sim.registry import COLORS, FITTED, REGISTRY, WA_ABLATION, Policy
from tongyi_trace.sim.simulate import simulate_policy
from tongyi_trace.sim.stream import Stream, stream_from_lists
from tongyi_trace.sim.structs import (
    G_POLICY,
    NUM_ROWS,
    POLICY_COL0,
    PRESENT,
    heap_pop_valid,
    heap_push,
    make_state,
)


@pytest.mark.parametrize("policy", list(Policy))
def test_a_policy_declares_its_state_within_its_share(policy: Policy) -> None:
    hooks = REGISTRY[policy].hooks
    decl: StateDecl = hooks.STATE
    cols = [decl.col(n) for n in decl.columns]
    assert len(set(cols)) == len(cols) and all(POLICY_COL0 <= c < NUM_ROWS for c in cols)
    assert all(decl.slot(n) >= G_POLICY for n in decl.slots)
    stream = stream_from_lists([[1, 2, 3], [1, 2, 4], [5]], times_s=[0.0, 1.0, 2.0], categories=["a", "b", "a"])
    typed, _ = REGISTRY[policy].make_params({})
    setup = hooks.init(typed, InitContext(stream, 2))
    assert setup.ip.shape == (8,) and setup.fp.shape == (8,)
    assert len(setup.g0) >= len(decl.slots) and len(setup.gf0) >= len(decl.fslots)
    assert setup.num_queues >= 1


def test_a_policy_may_not_declare_more_columns_than_its_share() -> None:
    with pytest.raises(ValueError, match="at most"):
        StateDecl(columns={f"C{i}": "" for i in range(NUM_ROWS - POLICY_COL0 + 1)})


def test_heap_pops_by_key_then_push_order_and_skips_stale_entries() -> None:
    bk, hp, g, _, _, _ = make_state(8, 1, 16, np.zeros(0, np.int64), np.zeros(0))
    bk[:8, PRESENT] = 1
    for x, key in [(1, 5), (2, 5), (3, 3), (4, 7), (3, 9), (0, 5)]:  # block 3's first entry becomes stale
        heap_push(bk, hp, g, x, key)
    popped = [heap_pop_valid(bk, hp, g) for _ in range(6)]
    assert popped == [(1, 5), (2, 5), (0, 5), (4, 7), (3, 9), (-1, 0)]


def test_heap_compacts_when_full_and_keeps_the_order() -> None:
    bk, hp, g, _, _, _ = make_state(4, 1, 6, np.zeros(0, np.int64), np.zeros(0))
    bk[:4, PRESENT] = 1
    for k in range(20):  # 20 pushes into 6 entries: only each block's newest entry survives compaction
        heap_push(bk, hp, g, k % 4, 100 - k)
    assert [heap_pop_valid(bk, hp, g)[0] for _ in range(5)] == [3, 2, 1, 0, -1]


def test_every_policy_and_variant_has_a_colour() -> None:
    assert {*Policy, *WA_ABLATION, FITTED} <= set(COLORS)
    assert len(set(COLORS.values())) == len(COLORS)


def _gdsf_reference(s: Stream, capacity: int) -> tuple[list[int], int]:
    """(hit blocks per request, evictions) of GDSF over S (gdsf.py's defaults, no leaf_only) with one
    Python heap of (key, push stamp, block) and the kernel's steps (kernel.py's module doc)."""
    present: set[int] = set()
    pinned: set[int] = set()
    freq: dict[int, int] = {}
    newest: dict[int, int] = {}
    heap: list[tuple[int, int, int]] = []
    stamp, clock, evictions, hits = 0, 0.0, 0, []
    for r in range(s.num_requests):
        blocks = s.blk[s.req_off[r]:s.req_off[r + 1]].tolist()
        ntok = s.ntok[s.req_off[r]:s.req_off[r + 1]].tolist()
        h = 0
        while h < len(blocks) and blocks[h] in present and blocks[h] not in pinned:
            pinned.add(blocks[h])
            freq[blocks[h]] += 1
            h += 1
        full = False
        for x in blocks[h:]:
            if x in present:
                if x not in pinned:
                    pinned.add(x)
                    freq[x] += 1
                continue
            while not full and len(present) >= capacity:
                while heap:
                    key, st, v = heapq.heappop(heap)
                    if newest[v] == st and v in present and v not in pinned:
                        present.discard(v)
                        clock = key / gdsf.KEY_SCALE
                        evictions += 1
                        break
                else:
                    full = True
            if not full:
                present.add(x)
                pinned.add(x)
                freq[x] = 1
        for k in range(len(blocks) - 1, -1, -1):
            x = blocks[k]
            if x in pinned:
                pinned.discard(x)
                stamp += 1
                newest[x] = stamp
                prio = clock + freq[x] * gdsf.cost_per_token(k, ntok[k], float(s.block_size), 32768.0)
                heapq.heappush(heap, (int(prio * gdsf.KEY_SCALE), stamp, x))
        hits.append(h)
    return hits, evictions


def _prefix_chained(rng: np.random.Generator, num_requests: int) -> Stream:
    reqs: list[list[int]] = []
    fresh = 0
    for _ in range(num_requests):
        base = reqs[int(rng.integers(len(reqs)))] if reqs and rng.random() < 0.7 else []
        base = base[: int(rng.integers(len(base) + 1))]
        extra = int(rng.integers(0 if base else 1, 8))
        reqs.append(base + list(range(fresh, fresh + extra)))
        fresh += extra
    return stream_from_lists(reqs, num_tokens=[[int(rng.integers(1, 17)) for _ in r] for r in reqs])


@pytest.mark.parametrize("seed", range(6))
def test_gdsf_runs_pop_in_the_order_of_one_heap(seed: int) -> None:
    # GDSF keeps its priority queue as sorted runs under a heap of runs, compacting the arena when full
    # (gdsf.py): the victims must be those of one heap over every entry, so hits and evictions equal a
    # reference built on heapq, over streams long enough to compact the arena many times.
    rng = np.random.default_rng(seed)
    s = _prefix_chained(rng, 600)
    for capacity in (1, 3, 10, 40):
        res = simulate_policy(s, "gdsf", capacity)
        hits, evictions = _gdsf_reference(s, capacity)
        assert res.req_hit_blocks.tolist() == hits, capacity
        assert res.num_evictions == evictions > 0, capacity
