"""The free-block queue of the kvtrace vLLM plugin: vLLM's eviction order, replaced by a policy.

vLLM keeps every unpinned block in one FreeKVCacheBlockQueue (least recently freed at the front) and
evicts from the front. This class has the same interface (popleft, popleft_n, remove, append,
append_n, prepend_n, get_all_free_blocks, iter_blocks_after, num_free_blocks) and decides the order:

- blocks put back with `prepend_n` (no hash: never match a prefix) are reused first, LIFO, as in vLLM;
- blocks put back with `append_n` (cached) join the queue of their category w, ordered by last access;
  a block's category and offset are those of the request that released it last (`note_request`,
  called by the plugin when vLLM frees a request's blocks);
- the clock: when requests carry their trace time (`vllm_xargs` "kv_time_s", sent by `kvtrace replay`),
  the queue runs on trace time exactly like the simulator: a released block's last access is its
  request's trace time, and "now" is the latest trace time of a request the scheduler has seen
  (`observe_time`). Otherwise last access is the release time and now the wall clock, both
  multiplied by `time_scale` (trace seconds per wall second);
- eviction picks among the cached blocks with the mode's rule:
  * `wa`   (paper section 4.2): compare the W queue heads in the total order of
    tongyi_trace.policy.wa_priority (log ReuseProb_w(t, life), -offset, last access, block key), the model
    (exp or km), conditional and life window as the policy file says; the first goes. The block key
    is the simulator's id of the block when its request sent one (`vllm_xargs` "kv_block_keys", sent
    by `kvtrace replay`), so that exact ties break as in the simulator; else UNKEYED + vLLM's block id.
  * `lru`  the least recently freed block (the global LRU head is one of the W heads): vLLM's own order.
  * `fifo` the block that entered the cache first (a hit does not move it).
  * `s3fifo` S3-FIFO (small + main FIFO + ghost), see s3fifo.py.
  Any exception while deciding falls back to the LRU choice for that eviction and is counted.
- prefix closure (`leaf_only`, on for WA), as the simulator's kernel: a block's parent is the block
  before it in the request that released it (`note_request`); a victim that still has cached children
  is held back (out of the order, still free for vLLM: a hit takes it back) and evicted first as soon
  as its last cached child goes. Generation counters keep the parent links right when a physical block
  is reused for other content.

Pure Python on duck-typed blocks (`block_id`, `block_hash`): it runs inside vLLM and in plain tests.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tongyi_trace.policy.names import EVICTION_MODES
from tongyi_trace.policy.refit import CategoryFit
from tongyi_trace.policy.wa_priority import MODELS, evicts_before, log_reuse_prob
from tongyi_trace.vllm_plugin.guard import GuardControl, block_key
from tongyi_trace.vllm_plugin.s3fifo import S3FifoOrder
from tongyi_trace.vllm_plugin.settings import QueuePolicy
from tongyi_trace.vllm_plugin.stats import PluginStats

DEFAULT_CATEGORY = "default"
_NOT_FREE = -2
_UNCACHED = -1
_HELD = -3  # leaf_only: chosen while it had cached children
UNKEYED = 1 << 62  # the tie-break key of a block whose request sent no kv_block_keys: UNKEYED + block id


class PolicyFreeQueue:
    """Drop-in replacement for vLLM's FreeKVCacheBlockQueue with a pluggable eviction order."""

    def __init__(self, blocks: list[Any], policy: QueuePolicy, stats: PluginStats | None = None,
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        if policy.mode not in EVICTION_MODES:
            raise ValueError(f"eviction mode {policy.mode!r} is not one of {', '.join(EVICTION_MODES)}")
        policy = policy.for_pool(len(blocks) - 1)  # vLLM's null block never holds content
        self.policy = policy
        self.stats = stats if stats is not None else PluginStats(mode=policy.mode)
        self._clock_s = clock_s
        self._names = [DEFAULT_CATEGORY, *sorted(k for k in policy.categories if k != DEFAULT_CATEGORY)]
        self._index = {name: i for i, name in enumerate(self._names)}
        params = [policy.categories.get(n, policy.default) for n in self._names]
        self._p = [c.reuse_prob for c in params]
        self._rate = [c.rate_per_s for c in params]
        self._life = [policy.life_s if policy.life_s > 0 else c.life_s for c in params]
        self._table = [tuple(c.km_cdf_table()) for c in params]
        self._model = MODELS.index(policy.model)
        self._leaf_only = policy.prefix_closed
        self._queues: list[OrderedDict[int, Any]] = [OrderedDict() for _ in self._names]
        self._uncached: OrderedDict[int, Any] = OrderedDict()
        n = max((b.block_id for b in blocks), default=-1) + 1
        self._where = [_NOT_FREE] * n       # _NOT_FREE, _UNCACHED or a category index
        self._cat = [0] * n                 # category of the last releasing request
        self._offset = [0] * n              # block position in that request
        self._last_s = [0.0] * n            # last access on the policy clock (seconds, see now_s)
        self._seq = [0] * n                 # release order (ties and LRU)
        self._key = [UNKEYED + i for i in range(n)]  # WA's last tie-break (see the module doc)
        self._first_seq = [-1] * n          # FIFO: when the block entered the cache (-1 = not cached)
        self._req_s = [math.nan] * n        # trace time of the last releasing request (nan: none given)
        self._parent = [-1] * n             # leaf_only: the block before it in its request (-1: none)
        self._pgen = [0] * n                # generation of that parent when the link was made
        self._gen = [0] * n                 # bumped each time the block's content is dropped
        self._nchild = [0] * n              # cached children linked to this block
        self._ready: OrderedDict[int, Any] = OrderedDict()  # held back, now leaves: evicted first
        self._held: dict[int, Any] = {}     # held back, still with cached children
        self.trace_now_s: float | None = None
        self._fifo_heap: list[tuple[int, int]] = []
        self._s3 = S3FifoOrder(max(1, len(blocks) - 1), policy.s3fifo) if policy.mode == "s3fifo" else None
        self._next_seq = 0
        self.guard_ctl: Any = None
        if policy.mode == "wa" and policy.guard is not None and policy.guard.active:
            self.guard_ctl = GuardControl(policy.guard, policy, max(1, len(blocks) - 1), self._names, self.stats,
                                          queue_class=type(self))  # its shadows run queues of this class
        for b in blocks:
            self._uncached[b.block_id] = b
            self._where[b.block_id] = _UNCACHED
        self.num_free_blocks = len(blocks)

    # --- annotations from the plugin -------------------------------------------------------------
    def category_index(self, name: object) -> int:
        """Index of category NAME (unknown or missing -> `default`)."""
        return self._index.get(name, 0) if isinstance(name, str) else 0

    def note_request(self, blocks: Iterable[Any], category: object, time_s: float | None = None,
                     keys: list[int] | None = None) -> None:
        """Record that a request of CATEGORY (trace time TIME_S, if known) releases BLOCKS, given in
        request order (position = offset); KEYS: the blocks' identities, by position (what `kvtrace
        replay` sends as kv_block_keys: the simulator's block ids): WA's last tie-break and what the guard
        samples (past its end: UNKEYED + the block id, and the vLLM block hash for the guard)."""
        cat = self.category_index(category)
        req_s = math.nan if time_s is None else float(time_s)
        if time_s is not None:
            self.observe_time(req_s)
        prev = -1
        for pos, b in enumerate(blocks):
            bid = b.block_id
            self._ensure(bid)
            self._cat[bid] = cat
            self._offset[bid] = pos
            self._req_s[bid] = req_s
            self._key[bid] = keys[pos] if keys is not None and pos < len(keys) else UNKEYED + bid
            if b.block_hash is None:
                prev = -1
                continue
            if prev >= 0 and not self._linked(bid):
                self._parent[bid] = prev
                self._pgen[bid] = self._gen[prev]
                self._nchild[prev] += 1
            prev = bid
        if self.guard_ctl is not None:
            self._guard_step(blocks, cat, req_s, keys or [])

    def _guard_step(self, blocks: Iterable[Any], cat: int, req_s: float, sent: list[int]) -> None:
        """Feed the guard and the refit one released request (block identities: SENT by position, else
        the block hash); apply a refit (see guard.py)."""
        try:
            keys = [sent[pos] if pos < len(sent) else block_key(b.block_hash)
                    for pos, b in enumerate(blocks) if b.block_hash is not None]
            t = req_s if req_s == req_s else self.now_s()
            self.set_category_fits(self.guard_ctl.on_request(keys, cat, t, self.category_fits))
        except Exception as e:  # never break serving: the guard keeps its state, counted
            self.stats.record_fallback(f"guard: {type(e).__name__}: {e}")

    def category_fits(self) -> dict[int, CategoryFit]:
        """The reuse model of every category index now."""
        return {i: CategoryFit(self._p[i], self._rate[i], tuple(self._table[i])) for i in range(len(self._names))}

    def set_category_fits(self, fits: dict[int, CategoryFit]) -> None:
        """Replace the reuse model of the category indexes in FITS (an online refit)."""
        for i, f in fits.items():
            self._p[i], self._rate[i], self._table[i] = f.reuse_prob, f.rate_per_s, f.km_cdf

    def _linked(self, bid: int) -> bool:
        """Whether BID is counted among the cached children of a live parent."""
        p = self._parent[bid]
        return p >= 0 and self._pgen[bid] == self._gen[p]

    def observe_time(self, time_s: float) -> None:
        """A request of trace time TIME_S reached the scheduler: the trace clock moves forward to it."""
        if self.trace_now_s is None or time_s > self.trace_now_s:
            self.trace_now_s = time_s

    def now_s(self) -> float:
        """The policy clock: trace time when requests carry it, else scaled wall time."""
        if self.trace_now_s is not None:
            return self.trace_now_s
        return self._clock_s() * self.policy.time_scale

    # --- the FreeKVCacheBlockQueue interface -------------------------------------------------------
    def popleft(self) -> Any:
        """Take the next block to reuse (evicting its cached content if any)."""
        if self.num_free_blocks == 0:
            raise ValueError("No free blocks available")
        return self._pop(self.now_s())

    def popleft_n(self, n: int) -> list[Any]:
        """Take N blocks to reuse."""
        if n == 0:
            return []
        if n > self.num_free_blocks:
            raise ValueError(f"Cannot pop {n} blocks: only {self.num_free_blocks} are free")
        now_s = self.now_s()
        return [self._pop(now_s) for _ in range(n)]

    def remove(self, block: Any) -> None:
        """Take BLOCK out of the free set (a prefix-cache hit pins it again)."""
        bid = block.block_id
        where = self._where[bid] if 0 <= bid < len(self._where) else _NOT_FREE
        if where == _NOT_FREE:
            raise RuntimeError(f"remove() called on a block that is not free: {bid}")
        if where == _UNCACHED:
            del self._uncached[bid]
        elif where == _HELD:
            self._held.pop(bid, None)
            self._ready.pop(bid, None)
            self.stats.hits_on_free += 1
            self.stats.record_hit(self._names[self._cat[bid]])
            if self._s3 is not None:
                self._s3.hit(bid)
        else:
            del self._queues[where][bid]
            self.stats.hits_on_free += 1
            self.stats.record_hit(self._names[where])
            if self._s3 is not None:
                self._s3.hit(bid)
        self._where[bid] = _NOT_FREE
        self.num_free_blocks -= 1

    def append(self, block: Any) -> None:
        """Put one released cached block back."""
        self.append_n([block])

    def append_n(self, blocks: list[Any]) -> None:
        """Put released cached blocks back, most evictable first (vLLM passes a request's tail first)."""
        if not blocks:
            return
        now_s = self.now_s()
        trace_clock = self.trace_now_s is not None
        for b in blocks:
            bid = b.block_id
            self._ensure(bid)
            cat = self._cat[bid]
            self._where[bid] = cat
            self._queues[cat][bid] = b
            req_s = self._req_s[bid]
            # on trace time, whole microseconds as the simulator keeps it (sim/kernel.py), so that equal
            # priorities (categories sharing a model) compare equal on both sides
            self._last_s[bid] = int(req_s * 1e6) * 1e-6 if trace_clock and req_s == req_s else now_s
            self._seq[bid] = seq = self._next_seq
            self._next_seq += 1
            if self._first_seq[bid] < 0:
                self._first_seq[bid] = seq
                if self._s3 is not None:
                    self._s3.cached(bid, b.block_hash)
            elif self._s3 is not None:
                self._s3.released(bid)
            if self.policy.mode == "fifo":
                heapq.heappush(self._fifo_heap, (self._first_seq[bid], bid))
        self.num_free_blocks += len(blocks)
        if self.policy.mode == "fifo" and len(self._fifo_heap) > 4 * self.num_free_blocks + 1024:
            self._compact_fifo()
        self.stats.maybe_flush()

    def prepend_n(self, blocks: list[Any]) -> None:
        """Put blocks without a cached hash at the front (reused first, in the given order)."""
        for b in reversed(blocks):
            bid = b.block_id
            self._ensure(bid)
            self._uncached[bid] = b
            self._uncached.move_to_end(bid, last=False)
            self._where[bid] = _UNCACHED
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[Any]:
        """All free blocks in eviction order (for tests and debugging: O(n^2) under WA)."""
        return list(self.iter_blocks_after(None))

    def iter_blocks_after(self, cursor: Any | None) -> Iterator[Any]:
        """Free blocks: the uncached ones first, then the cached ones by release order."""
        cached = sorted([*(b for q in self._queues for b in q.values()), *self._held.values()],
                        key=lambda b: self._seq[b.block_id])
        order = [*self._uncached.values(), *cached]
        start = 0
        if cursor is not None:
            ids = [b.block_id for b in order]
            start = ids.index(cursor.block_id) + 1 if cursor.block_id in ids else len(order)
        yield from order[start:]

    # --- deciding -----------------------------------------------------------------------------------
    def _pop(self, now_s: float) -> Any:
        if self._uncached:
            bid, block = self._uncached.popitem(last=False)
            self._drop(bid)
            return block
        t0 = time.perf_counter_ns()
        if self._ready or not any(self._queues):  # held back and now a leaf (else: only held blocks are free)
            bid, block = self._ready.popitem(last=False) if self._ready else next(iter(self._held.items()))
            del self._held[bid]
            name = self._names[self._cat[bid]]
        else:
            while True:
                try:
                    cat = self._choose(now_s)
                except Exception as e:  # never break serving: LRU for this eviction, counted
                    self.stats.record_fallback(f"{type(e).__name__}: {e}")
                    cat = self._choose_lru()
                bid, block = self._queues[cat].popitem(last=False)
                name = self._names[cat]
                if not (self._leaf_only and self._nchild[bid] > 0) or not any(self._queues):
                    break
                self._where[bid] = _HELD  # it has cached children: hold it back, choose again
                self._held[bid] = block
                self._out_of_order(bid)
                self.stats.num_held += 1
        self.stats.record_eviction(name, time.perf_counter_ns() - t0, cached=block.block_hash is not None)
        self._drop(bid)
        return block

    def _out_of_order(self, bid: int) -> None:
        """BID is held back: it leaves the FIFO and S3-FIFO orders as in the simulator; released again after
        a hit, it rejoins them at the newest end (FIFO: as if it entered the cache then)."""
        if self._s3 is not None:
            self._s3.park(bid)
        elif self.policy.mode == "fifo":
            self._first_seq[bid] = -1

    def _drop(self, bid: int) -> None:
        """BID leaves the free set for new content: unlink it from its parent, forget its order."""
        if self._linked(bid):
            p = self._parent[bid]
            self._nchild[p] -= 1
            if self._nchild[p] == 0 and p in self._held:  # a held-back parent is now a leaf
                self._ready[p] = self._held[p]
        self._parent[bid] = -1
        self._gen[bid] += 1
        self._nchild[bid] = 0
        self._where[bid] = _NOT_FREE
        self._first_seq[bid] = -1
        if self._s3 is not None:
            self._s3.forget(bid)
            self._s3.allocated(bid)
        self.num_free_blocks -= 1

    def _choose(self, now_s: float) -> int:
        mode = self.policy.mode
        if mode == "lru" or (self.guard_ctl is not None and self.guard_ctl.lru_order):
            return self._choose_lru()
        if mode == "fifo":
            return self._choose_fifo()
        if mode == "s3fifo":
            return self._choose_s3fifo()
        return self._choose_wa(now_s)

    def _choose_lru(self) -> int:
        best, best_seq = -1, -1
        for i, q in enumerate(self._queues):
            if q:
                s = self._seq[next(iter(q))]
                if best < 0 or s < best_seq:
                    best, best_seq = i, s
        return best

    def _choose_fifo(self) -> int:
        heap = self._fifo_heap
        while heap:
            first, bid = heap[0]
            where = self._where[bid]
            if where >= 0 and self._first_seq[bid] == first:
                # FIFO pops a block from the middle of its category queue: move it to the head.
                self._queues[where].move_to_end(bid, last=False)
                return where
            heapq.heappop(heap)
        raise RuntimeError("FIFO heap is out of sync with the free blocks")

    def _choose_s3fifo(self) -> int:
        assert self._s3 is not None
        where = self._where
        bid = self._s3.choose(lambda b: where[b] >= 0)
        if bid < 0:
            raise RuntimeError("S3-FIFO queues hold no free block")
        self._queues[where[bid]].move_to_end(bid, last=False)
        return where[bid]

    def _choose_wa(self, now_s: float) -> int:
        pol = self.policy
        best = -1
        best_key: tuple[float, int, float, int] = (0.0, 0, 0.0, 0)
        for i, q in enumerate(self._queues):
            if not q:
                continue
            bid = next(iter(q))
            last = self._last_s[bid]
            prio = log_reuse_prob(self._model, self._p[i], self._rate[i], self._table[i], now_s - last,
                                  self._life[i], pol.use_life, pol.conditional)
            key = (prio, self._offset[bid], last, self._key[bid])
            if best < 0 or evicts_before(*key, *best_key, pol.use_offset):
                best, best_key = i, key
        return best

    def _ensure(self, bid: int) -> None:
        if bid >= len(self._where):
            grow = bid + 1 - len(self._where)
            self._where += [_NOT_FREE] * grow
            self._cat += [0] * grow
            self._offset += [0] * grow
            self._last_s += [0.0] * grow
            self._seq += [0] * grow
            self._key += [UNKEYED + i for i in range(len(self._key), len(self._key) + grow)]
            self._first_seq += [-1] * grow
            self._req_s += [math.nan] * grow
            self._parent += [-1] * grow
            self._pgen += [0] * grow
            self._gen += [0] * grow
            self._nchild += [0] * grow

    def _compact_fifo(self) -> None:
        self._fifo_heap = [(f, b) for f, b in self._fifo_heap if self._where[b] >= 0 and self._first_seq[b] == f]
        heapq.heapify(self._fifo_heap)

    def free_cached_blocks_by_category(self) -> dict[str, int]:
        """How many free cached blocks each category holds now."""
        return {self._names[i]: len(q) for i, q in enumerate(self._queues) if q}
