"""Decision time per eviction of the vLLM plugin's free-block queue (pure Python, outside vLLM).

A pool of 16,384 blocks; requests of 64 blocks from 12 categories (the to-C turn buckets) are
allocated, released and sometimes hit again, so every allocation evicts. Prints mean and P99
microseconds per eviction for each mode, and the paper's figure for WA inside vLLM (79 us,
section 4.2) as the reference it is compared with.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from tongyi_trace.policy.file import CategoryParams
from tongyi_trace.policy.names import EVICTION_MODES
from tongyi_trace.vllm_plugin.queue import PolicyFreeQueue
from tongyi_trace.vllm_plugin.settings import QueuePolicy

NUM_BLOCKS = 16_384
REQ_BLOCKS = 64
NUM_REQUESTS = 3_000
PAPER_WA_US = 79.0
CATS = [f"{t}-{b}" for t in ("text", "file", "image", "search") for b in ("1", "2", "3+")]


@dataclass
class Block:
    block_id: int
    block_hash: object = None


def run(mode: str) -> tuple[float, float, int]:
    rng = random.Random(1)
    cats = {c: CategoryParams(rng.uniform(0.1, 0.9), rate := rng.uniform(0.001, 0.1), 1 / rate, rng.uniform(10, 900))
            for c in CATS}
    blocks = [Block(i) for i in range(NUM_BLOCKS)]
    t_s = [0.0]
    q = PolicyFreeQueue(blocks, QueuePolicy(mode=mode, categories=cats, default=cats["text-1"]),
                        clock_s=lambda: t_s[0])
    q.popleft()  # the null block
    recent: list[list[Block]] = []
    for i in range(NUM_REQUESTS):
        t_s[0] += 0.5
        if recent and rng.random() < 0.3:  # a hit on a recent request's free blocks
            got = [b for b in rng.choice(recent) if q._where[b.block_id] >= 0]
            for b in got:
                q.remove(b)
        else:
            got = q.popleft_n(REQ_BLOCKS)
            for b in got:
                b.block_hash = ("h", i, b.block_id)
        q.note_request(got, rng.choice(CATS))
        q.append_n(list(reversed(got)))
        recent = [*recent[-20:], got]
    s = q.stats.snapshot()
    return s["decision_mean_us"], s["decision_p99_us"], s["evictions"]


def main() -> None:
    print(f"pool {NUM_BLOCKS} blocks, {len(CATS)} categories, {NUM_REQUESTS} requests of {REQ_BLOCKS} blocks")
    for mode in EVICTION_MODES:
        t0 = time.perf_counter()
        mean_us, p99_us, n = run(mode)
        wall = time.perf_counter() - t0
        ratio = f"  ratio to paper WA {PAPER_WA_US:.0f} us: {mean_us / PAPER_WA_US:.3f}" if mode == "wa" else ""
        print(f"{mode:7s} evictions {n:>8,}  decision mean {mean_us:7.2f} us  P99 {p99_us:7.2f} us"
              f"  ({wall:.1f} s){ratio}")


if __name__ == "__main__":
    main()
