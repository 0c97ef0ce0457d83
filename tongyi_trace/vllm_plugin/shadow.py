"""A shadow prefix cache for the guard inside the engine: a pool of stand-in blocks managed as vLLM's
BlockPool manages its blocks (a hash -> block map and a free queue), with the plugin's own
PolicyFreeQueue deciding the order, so a shadow runs exactly the eviction code the engine runs.

Requests are served whole, one at a time: the longest prefix of cached keys hits (those blocks are taken
out of the free queue), the other keys take a block from the queue (evicting its content), then the
request releases all its blocks, tail first, as vLLM does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tongyi_trace.vllm_plugin.settings import QueuePolicy
from tongyi_trace.vllm_plugin.stats import PluginStats


@dataclass
class _Slot:
    block_id: int
    block_hash: int | None = None


class ShadowCache:
    """CAPACITY_BLOCKS blocks of sampled keys under POLICY (its mode: wa or lru), in a free queue of
    QUEUE_CLASS (the plugin's PolicyFreeQueue, given by the queue that owns the guard: the shadow does not
    import it, so the queue, the guard and the shadows import each other in one direction only)."""

    def __init__(self, capacity_blocks: int, policy: QueuePolicy, queue_class: type[Any]) -> None:
        slots = [_Slot(i) for i in range(capacity_blocks + 1)]  # one more: vLLM's null block, taken below
        self.queue = queue_class(slots, policy, PluginStats(mode=policy.mode))
        self.queue.popleft()
        self._cached: dict[int, _Slot] = {}

    @classmethod
    def over(cls, queue: Any) -> ShadowCache:
        """This pool logic over an existing QUEUE of free blocks (all free, none cached): a stand-in for
        vLLM's BlockPool in tests (it takes the null block, as BlockPool does)."""
        shadow = cls.__new__(cls)
        shadow.queue, shadow._cached = queue, {}
        queue.popleft()
        return shadow

    def serve(self, keys: list[int], category: object, time_s: float, block_keys: list[int] | None = None) -> int:
        """Serve one request of CATEGORY at trace time TIME_S holding KEYS (block hashes, in order); its hit
        blocks. BLOCK_KEYS: what the request sends as kv_block_keys (tests: the engine's guard)."""
        q = self.queue
        q.observe_time(time_s)
        held: list[_Slot] = []
        seen: set[int] = set()
        hits = 0
        prefix = True
        for k in keys:
            if k in seen:  # the same key twice in a request: the prefix stops there
                prefix = False
                continue
            seen.add(k)
            slot = self._cached.get(k)
            if slot is not None:
                q.remove(slot)
                hits += prefix
            else:
                prefix = False
                if q.num_free_blocks == 0:
                    continue
                slot = q.popleft()
                if slot.block_hash is not None:
                    del self._cached[slot.block_hash]
                slot.block_hash = k
                self._cached[k] = slot
            held.append(slot)
        q.note_request(held, category, time_s, block_keys)
        q.append_n(held[::-1])
        return hits
