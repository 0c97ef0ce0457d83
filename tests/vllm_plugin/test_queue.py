"""The shared WA priority and the plugin's free-block queue, outside vLLM (pure Python, real code)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.policy.file import CategoryParams
from tongyi_trace.policy.wa_priority import (
    MODEL_EXP,
    MODEL_KM,
    evicts_before,
    km_cdf,
    km_grid_s,
    log_reuse_prob,
    reuse_prob,
)
from tongyi_trace.vllm_plugin.queue import PolicyFreeQueue
from tongyi_trace.vllm_plugin.settings import QueuePolicy


@dataclass
class Block:
    """The two attributes of vLLM's KVCacheBlock the queue reads."""

    block_id: int
    block_hash: object = None


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


HOT = CategoryParams(reuse_prob=0.9, rate_per_s=0.1, mean_reuse_s=10.0, life_s=10.0)
COLD = CategoryParams(reuse_prob=0.1, rate_per_s=0.1, mean_reuse_s=10.0, life_s=10.0)


def make(mode: str, num_blocks: int = 8, cats: dict[str, CategoryParams] | None = None,
         **kw: object) -> tuple[PolicyFreeQueue, list[Block], Clock]:
    clock = Clock()
    blocks = [Block(i) for i in range(num_blocks)]
    policy = QueuePolicy(mode=mode, categories=cats if cats is not None else {"hot": HOT, "cold": COLD},
                         default=COLD, **kw)  # type: ignore[arg-type]
    return PolicyFreeQueue(blocks, policy, clock_s=clock), blocks, clock


def release(q: PolicyFreeQueue, blocks: list[Block], category: str | None) -> None:
    """What vLLM does when a request finishes: annotate, then append its cached blocks tail first."""
    for b in blocks:
        b.block_hash = ("h", b.block_id)
    q.note_request(blocks, category)
    q.append_n(list(reversed(blocks)))


def test_reuse_prob_known_values() -> None:
    # p exp(-lambda t) (1 - exp(-lambda life)) with p=0.5, lambda=ln 2, t=1, life=1 -> 0.5 * 0.5 * 0.5
    assert reuse_prob(0.5, math.log(2), 1.0, 1.0, True, False) == pytest.approx(0.125)
    # without the lifespan regulator the window is unbounded: 0.5 * 0.5
    assert reuse_prob(0.5, math.log(2), 1.0, 1.0, False, False) == pytest.approx(0.25)
    # conditional: divided by 1 - F(t) = 1 - 0.5 * (1 - 0.5) = 0.75
    assert reuse_prob(0.5, math.log(2), 1.0, 1.0, True, True) == pytest.approx(0.125 / 0.75)


def test_evicts_before_is_the_total_order() -> None:
    # (log prio, -offset, last access, block id): lower priority first; then deeper; then older; then id.
    cands = [(-1.0, 0, 5.0, 7), (-2.0, 0, 5.0, 3), (-1.0, 5, 5.0, 2), (-2.0, 2, 5.0, 9),
             (-1.0, 0, 4.0, 8), (-1.0, 0, 4.0, 1)]
    order = sorted(range(len(cands)), key=lambda i: (cands[i][0], -cands[i][1], cands[i][2], cands[i][3]))
    assert order == [3, 1, 2, 5, 4, 0]
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            assert evicts_before(*cands[a], *cands[b], use_offset=True)
            assert not evicts_before(*cands[b], *cands[a], use_offset=True)
    # without the offset key, the depth is skipped: the older of two equal priorities goes first
    assert evicts_before(-1.0, 0, 1.0, 5, -1.0, 9, 2.0, 1, use_offset=False)
    assert not evicts_before(-1.0, 9, 2.0, 1, -1.0, 0, 1.0, 5, use_offset=False)


def test_log_priority_never_underflows() -> None:
    # p e^(-rate t) is 0.0 in floating point past rate t = 745; the log keeps the order of two such blocks.
    a = log_reuse_prob(MODEL_EXP, 0.5, 1.0, None, 2000.0, 10.0, True, False)
    b = log_reuse_prob(MODEL_EXP, 0.5, 1.0, None, 1000.0, 10.0, True, False)
    assert math.isfinite(a) and a < b
    assert a == pytest.approx(math.log(0.5) - 2000.0 + math.log(-math.expm1(-10.0)))
    assert log_reuse_prob(MODEL_EXP, 0.0, 1.0, None, 1.0, 10.0, True, False) == -math.inf


def test_km_table_lookup_and_priority() -> None:
    grid = km_grid_s()
    table = [min(1.0, t / 100.0) * 0.6 for t in grid]  # F rises linearly to 0.6 at 100 s
    assert km_cdf(table, 0.0) == 0.0
    assert km_cdf(table, grid[10]) == pytest.approx(table[10])
    mid = (grid[10] + grid[11]) / 2
    assert km_cdf(table, mid) == pytest.approx((table[10] + table[11]) / 2)
    assert km_cdf(table, 1e9) == table[-1]
    assert km_cdf(table, math.inf) == table[-1]  # the unbounded window (use_life=False)
    # unconditional: F(t + life) - F(t); conditional: divided by 1 - F(t)
    f = [km_cdf(table, x) for x in (20.0, 30.0)]
    assert math.exp(log_reuse_prob(MODEL_KM, 0, 0, table, 20.0, 10.0, True, False)) == pytest.approx(f[1] - f[0])
    assert math.exp(log_reuse_prob(MODEL_KM, 0, 0, table, 20.0, 10.0, True, True)) == pytest.approx(
        (f[1] - f[0]) / (1 - f[0]))
    # without the lifespan regulator: F(inf) - F(t)
    assert math.exp(log_reuse_prob(MODEL_KM, 0, 0, table, 20.0, 10.0, False, False)) == pytest.approx(
        table[-1] - f[0])
    # past the last reuse the block is dead
    assert log_reuse_prob(MODEL_KM, 0, 0, table, 200.0, 10.0, True, False) == -math.inf


def test_wa_evicts_cold_category_first_even_if_more_recent() -> None:
    q, b, clock = make("wa")
    q.popleft_n(8)  # allocate everything
    release(q, b[0:2], "hot")       # older, but a hot category
    clock.now_s = 1.0
    release(q, b[2:4], "cold")      # newer, but cold
    clock.now_s = 2.0
    got = [x.block_id for x in q.popleft_n(4)]
    # cold first, deeper block (offset 1 = block 3) before offset 0; then hot, deeper first
    assert got == [3, 2, 1, 0]
    assert q.stats.evictions == 4
    assert q.stats.evictions_by_category == {"cold": 2, "hot": 2}


def test_wa_old_hot_block_loses_to_fresh_cold_block() -> None:
    # After 60 s the hot block's reuse prob 0.9 e^-6 (..) falls under a fresh cold block's 0.1 (..).
    q, b, clock = make("wa")
    q.popleft_n(8)
    release(q, b[0:1], "hot")
    clock.now_s = 60.0
    release(q, b[1:2], "cold")
    assert [x.block_id for x in q.popleft_n(2)] == [0, 1]


def test_unknown_or_missing_category_is_default() -> None:
    q, b, _ = make("wa")
    q.popleft_n(8)
    release(q, b[0:1], "no-such-category")
    release(q, b[1:2], None)
    assert q.free_cached_blocks_by_category() == {"default": 2}


def test_lru_matches_vllm_order() -> None:
    # vLLM: least recently freed first; within one request the tail block first.
    q, b, clock = make("lru")
    q.popleft_n(8)
    release(q, b[0:3], "hot")
    clock.now_s = 1.0
    release(q, b[3:5], "cold")
    q.remove(b[1])                   # a prefix hit pins block 1 again
    clock.now_s = 2.0
    release(q, [b[1]], "hot")
    assert [x.block_id for x in q.popleft_n(5)] == [2, 0, 4, 3, 1]


def test_fifo_ignores_hits() -> None:
    q, b, clock = make("fifo")
    q.popleft_n(8)
    release(q, b[0:2], "hot")        # cached first: 1 then 0 (tail first)
    clock.now_s = 1.0
    release(q, b[2:3], "cold")
    q.remove(b[0])
    clock.now_s = 2.0
    release(q, [b[0]], "cold")       # re-released after a hit: keeps its place in FIFO
    assert [x.block_id for x in q.popleft_n(3)] == [1, 0, 2]


def test_uncached_blocks_go_first_and_null_block_order() -> None:
    q, _, _ = make("wa", num_blocks=4)
    assert q.popleft().block_id == 0           # the null block, as in vLLM
    got = q.popleft_n(3)
    release(q, got[:1], "hot")
    q.prepend_n(got[1:])                        # blocks with no hash: reused first, in the given order
    assert [x.block_id for x in q.popleft_n(3)] == [2, 3, 1]
    assert q.num_free_blocks == 0
    with pytest.raises(ValueError):
        q.popleft()


def test_error_in_decision_falls_back_to_lru_and_is_counted() -> None:
    q, b, clock = make("wa")
    q.popleft_n(8)
    release(q, b[0:1], "hot")
    clock.now_s = 5.0
    release(q, b[1:2], "cold")      # WA would evict block 1 (cold) first
    q._p[q.category_index("hot")] = "corrupt"  # type: ignore[call-overload]  # an internal error
    assert q.popleft().block_id == 0  # LRU's choice: the least recently freed
    assert q.stats.fallbacks == 1 and "TypeError" in q.stats.fallback_reasons[0]


def test_remove_of_a_busy_block_raises_like_vllm() -> None:
    q, _, _ = make("wa", num_blocks=2)
    blk = q.popleft()
    with pytest.raises(RuntimeError):
        q.remove(blk)


ops = st.lists(st.tuples(st.sampled_from(["alloc", "free", "hit", "tick"]), st.integers(0, 7),
                         st.sampled_from(["hot", "cold", "x", None])), max_size=80)


@settings(max_examples=examples(150), deadline=None)
@given(ops=ops, mode=st.sampled_from(["wa", "lru", "fifo", "s3fifo"]))
def test_queue_accounting_property(ops: list[tuple[str, int, str | None]], mode: str) -> None:
    """Whatever happens, free + busy = all blocks, nothing is handed out twice, LRU = vLLM order."""
    q, blocks, clock = make(mode, num_blocks=8)
    busy: set[int] = set()
    free_cached: list[int] = []     # release order, for the LRU reference
    for op, k, cat in ops:
        if op == "alloc" and q.num_free_blocks > 0:
            n = min(q.num_free_blocks, 1 + k % 3)
            got = [x.block_id for x in q.popleft_n(n)]
            assert not busy & set(got) and len(set(got)) == n
            if mode == "lru":  # uncached blocks first, then cached ones in release order
                reused = [i for i in got if i in free_cached]
                assert reused == free_cached[: len(reused)]
            free_cached = [i for i in free_cached if i not in got]
            busy |= set(got)
        elif op == "free" and busy:
            rel = sorted(busy)[: 1 + k % 3]
            release(q, [blocks[i] for i in rel], cat)
            free_cached += list(reversed(rel))
            busy -= set(rel)
        elif op == "hit" and free_cached:
            i = free_cached[k % len(free_cached)]
            q.remove(blocks[i])
            free_cached.remove(i)
            busy.add(i)
        elif op == "tick":
            clock.now_s += k
        assert q.num_free_blocks + len(busy) == 8
    assert len(q.get_all_free_blocks()) == q.num_free_blocks


def test_trace_clock_from_requests_overrides_wall_clock() -> None:
    # Requests carry trace times: the wall clock (stuck at 0 here) no longer matters.
    q, b, _ = make("wa")
    q.popleft_n(8)
    for blk in b[0:2]:
        blk.block_hash = ("h", blk.block_id)
    q.note_request(b[0:1], "hot", time_s=0.0)
    q.append_n(b[0:1])
    q.note_request(b[1:2], "cold", time_s=60.0)
    q.append_n(b[1:2])
    assert q.now_s() == 60.0
    # at trace time 60 the hot block (t = 60 s) is below the fresh cold one, as in the wall-clock test
    assert [x.block_id for x in q.popleft_n(2)] == [0, 1]


def test_time_scale_multiplies_the_wall_clock() -> None:
    q, b, clock = make("wa", time_scale=60.0)
    q.popleft_n(8)
    release(q, b[0:1], "hot")
    clock.now_s = 1.0              # one wall second = 60 trace seconds
    release(q, b[1:2], "cold")
    assert q.now_s() == 60.0
    assert [x.block_id for x in q.popleft_n(2)] == [0, 1]


def test_s3fifo_one_hit_blocks_go_first_and_hits_promote() -> None:
    # pool of 10: small target 1 block. Blocks 1..3 cached in S in this order; block 1 hit once.
    q, b, _ = make("s3fifo", num_blocks=10)
    q.popleft_n(10)
    for i in (1, 2, 3):
        release(q, [b[i]], None)
    q.remove(b[1])                  # a hit: freq 1
    release(q, [b[1]], None)
    got = [x.block_id for x in q.popleft_n(2)]
    assert got == [2, 3]            # 1 moved to M instead of being evicted; 2, 3 are one-hit
    assert q.popleft().block_id == 1
    # block 2's hash is in the ghost: cached again it goes straight to M
    b[2].block_hash = None
    q.note_request([b[2]], None)
    b[2].block_hash = ("h", 2)
    q.append_n([b[2]])
    assert q._s3 is not None and 2 in q._s3.main
