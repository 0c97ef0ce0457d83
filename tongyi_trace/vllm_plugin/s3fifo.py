"""S3-FIFO order for the plugin's free-block queue (baseline `KVTRACE_EVICTION=s3fifo`).

Same algorithm and settings as the simulator's tongyi_trace/sim/policies/s3fifo.py (both read
tongyi_trace.policy.settings.S3FifoSettings; the defaults are shown):

    hit(x):     freq[x] = min(freq[x] + 1, freq_cap = 3)
    cached(x):  (x enters the cache, i.e. is released with a hash for the first time since it was
                allocated) freq[x] = 0; queue = M if x's hash is in the ghost G else S
    evict():    if |S| >= small_ratio (10%) of the pool (or M is empty): from S, else from M; the other
                on failure
    from S:     t = oldest of S: pinned -> to S's newest end; freq >= move_to_main_threshold (1) -> to M;
                else evict t, hash -> G
    from M:     t = oldest of M: pinned -> to M's newest end; freq > 0 -> freq - 1, to M's newest end;
                else evict t
    G: the hashes evicted from S; a hash is in G while fewer than ghost_ratio (90%) of the pool hashes entered G
    after it (a counter, as the simulator; one that returns leaves G without freeing its slot).

S and M hold every cached block, pinned (in use) or free, so a hit keeps the block's place. A hit here
is a prefix-cache hit on a free block (vLLM's BlockPool.touch of a block with no other user); hits on
blocks already in use by another request are not seen by the free queue. Queue walks, pinned blocks and
held-back blocks (prefix closure) follow the simulator's kernel step for step (the reference; the test
tests/vllm_plugin/test_same_order_as_simulator.py holds the two to the same hits): a walk over S gives up
after |S| + 1 pinned heads, one over M after |M| x (freq cap + 2) heads; a victim held back leaves S and
M (its frequency kept) and, hit and released again, rejoins the queue it entered the cache in, at the
newest end.

Source: Yang et al., "FIFO queues are all you need for cache eviction", SOSP'23, Algorithm 1 (move to M
after one hit in S), as the simulator; not libCacheSim's later S3FIFO.c (threshold 2, see
tongyi_trace/sim/policies/s3fifo.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from tongyi_trace.policy.settings import S3FifoSettings


class S3FifoOrder:
    """The S, M and G queues of S3-FIFO over block ids (free or pinned)."""

    def __init__(self, num_blocks: int, settings: S3FifoSettings | None = None) -> None:
        self.settings = s = settings if settings is not None else S3FifoSettings()
        self.small: OrderedDict[int, None] = OrderedDict()
        self.main: OrderedDict[int, None] = OrderedDict()
        self.ghost: OrderedDict[Any, int] = OrderedDict()  # hash -> ghost counter when it entered
        self.ghost_count = 0
        self.freq: dict[int, int] = {}
        self.small_target = max(1, int(s.small_ratio * num_blocks))
        self.ghost_size = max(1, int(s.ghost_ratio * num_blocks))
        self._hash: dict[int, Any] = {}
        self._to_main: dict[int, bool] = {}  # the queue the block entered the cache in (True: M)
        self._alloc_count: dict[int, int] = {}  # ghost counter when the block was handed out

    def allocated(self, bid: int) -> None:
        """BID was handed out for new content: its ghost test will use the ghost as it is now (the
        simulator inserts a block right after the eviction that made room for it)."""
        self._alloc_count[bid] = self.ghost_count

    def cached(self, bid: int, block_hash: Any) -> None:
        """Block BID enters the cache with BLOCK_HASH."""
        self.freq[bid] = 0
        self._hash[bid] = block_hash
        entered = self.ghost.pop(block_hash, None) if block_hash is not None else None
        now = self._alloc_count.pop(bid, self.ghost_count)
        to_main = entered is not None and entered <= now and now - entered < self.ghost_size
        self._to_main[bid] = to_main
        (self.main if to_main else self.small)[bid] = None

    def hit(self, bid: int) -> None:
        """A prefix-cache hit on BID."""
        if bid in self.freq:
            self.freq[bid] = min(self.freq[bid] + 1, self.settings.freq_cap)

    def park(self, bid: int) -> None:
        """BID, just chosen, is held back (it has cached children): out of S and M, still cached."""
        self.small.pop(bid, None)
        self.main.pop(bid, None)

    def released(self, bid: int) -> None:
        """Cached BID is free again: one that was held back rejoins the queue it entered the cache in."""
        if bid in self.freq and bid not in self.small and bid not in self.main:
            (self.main if self._to_main[bid] else self.small)[bid] = None

    def forget(self, bid: int) -> None:
        """BID's cached content is gone (evicted or its hash dropped)."""
        self.small.pop(bid, None)
        self.main.pop(bid, None)
        self.freq.pop(bid, None)
        self._hash.pop(bid, None)
        self._to_main.pop(bid, None)

    def choose(self, is_free: Callable[[int], bool]) -> int:
        """The block to evict (a free one); -1 when S and M hold no free block."""
        if len(self.small) >= self.small_target or not self.main:
            bid = self._from_small(is_free)
            return bid if bid >= 0 else self._from_main(is_free)
        bid = self._from_main(is_free)
        return bid if bid >= 0 else self._from_small(is_free)

    def _from_small(self, is_free: Callable[[int], bool]) -> int:
        guard = len(self.small)
        while self.small:
            bid = next(iter(self.small))
            if not is_free(bid):
                self.small.move_to_end(bid)
                guard -= 1
                if guard < 0:
                    return -1
                continue
            del self.small[bid]
            if self.freq.get(bid, 0) >= self.settings.move_to_main_threshold:
                self.main[bid] = None
                continue
            h = self._hash.get(bid)
            if h is not None:
                self.ghost_count += 1
                self.ghost.pop(h, None)
                self.ghost[h] = self.ghost_count
                # keep twice the window: a block allocated earlier in this step still looks back
                while self.ghost and self.ghost_count - next(iter(self.ghost.values())) >= 2 * self.ghost_size:
                    self.ghost.popitem(last=False)
            self.small[bid] = None  # still cached until the caller evicts it
            self.small.move_to_end(bid, last=False)
            return bid
        return -1

    def _from_main(self, is_free: Callable[[int], bool]) -> int:
        guard = len(self.main) * (self.settings.freq_cap + 2)
        while self.main:
            bid = next(iter(self.main))
            guard -= 1
            if guard < 0:
                self.main.move_to_end(bid)
                return -1
            if not is_free(bid):
                self.main.move_to_end(bid)
                continue
            if self.freq.get(bid, 0) > 0:
                self.freq[bid] -= 1
                self.main.move_to_end(bid)
                continue
            return bid
        return -1
