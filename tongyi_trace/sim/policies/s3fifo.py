"""S3-FIFO: a small FIFO S (10% of the cache) filters one-hit blocks, a main FIFO M with lazy
re-insertion keeps the rest, a ghost FIFO G of recently evicted ids sends returning blocks straight to M.

    access(x):  freq[x] = min(freq[x] + 1, freq_cap)
    insert(x):  freq[x] = 0; destination = M if x in G else S (queued at release, deepest first)
    evict():    if |S| >= small_ratio x capacity: evictS() (falls back to evictM() when S has no victim)
                else: evictM() (falls back to evictS())
    evictS():   t = oldest of S
                if freq[t] >= move_to_main_threshold: move t to M (freq kept), continue
                else: remove t, add t to G, return t
    evictM():   t = oldest of M
                if freq[t] > 0: freq[t] -= 1, re-insert t at M's newest end, continue
                else: remove t, return t
    G holds the last ghost_ratio x capacity evicted-from-S ids (a counter, no list: x is in G when
    fewer than |G| ids were added after it).
Pinned blocks (the running request's) met at a queue's oldest end are moved to its newest end.

Source: Yang, Zhang, Qiu, Yue, Vinayak, "FIFO queues are all you need for cache eviction", SOSP'23,
Algorithm 1 (small FIFO 10%, ghost 90% of the cache, a block hit while in S moves to M, frequency capped
at 3). This is the paper's algorithm, not libCacheSim's current S3FIFO.c (PyPI libcachesim 0.3.5), which is
a later variant: move-to-main threshold 2, insertion into M while S is full before the first eviction, and
a 2-bit clock in M; so the two differ on the same stream (tests/sim/test_vs_libcachesim.py says so and
checks LRU, FIFO and LFU for exact agreement instead). `--set s3fifo.move_to_main_threshold=2` gives
libCacheSim's threshold.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from tongyi_trace.sim.policy_base import PolicySpec
from tongyi_trace.sim.structs import AUX, AUX2, FREQ, G_GHOST, PINNED, QID, q_append, q_head, q_unlink

_S = 0
_M = 1


@dataclass(frozen=True)
class S3FifoParams:
    """S3-FIFO queue sizes and thresholds."""

    small_ratio: float = field(default=0.10, metadata={"help": "small FIFO share of the capacity"})
    ghost_ratio: float = field(default=0.90, metadata={"help": "ghost entries as a share of the capacity"})
    move_to_main_threshold: int = field(default=1, metadata={
        "help": "hits while in S needed to move to M"})
    freq_cap: int = field(default=3, metadata={"help": "frequency counter saturates here"})

    def __post_init__(self) -> None:
        from tongyi_trace.errors import UsageError

        if not 0.0 < self.small_ratio < 1.0:
            raise UsageError(f"policy s3fifo: parameter small_ratio must be in (0, 1), got {self.small_ratio}")
        if not 0.0 <= self.ghost_ratio <= 10.0:
            raise UsageError(f"policy s3fifo: parameter ghost_ratio must be in [0, 10], got {self.ghost_ratio}")
        if self.move_to_main_threshold < 1 or self.freq_cap < 1:
            raise UsageError("policy s3fifo: parameters move_to_main_threshold and freq_cap must be >= 1")

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(ip, fp) for the kernel."""
        ip = np.zeros(8, np.int64)
        fp = np.zeros(8, np.float64)
        ip[0] = self.move_to_main_threshold
        ip[1] = self.freq_cap
        fp[0] = self.small_ratio
        fp[1] = self.ghost_ratio
        return ip, fp


SPEC = PolicySpec("s3fifo", S3FifoParams, "S3-FIFO (SOSP'23): small + main FIFO + ghost",
                  num_queues=2)


@njit(cache=True, inline="always")
def access(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, x: int) -> None:
    if bk[x, FREQ] < ip[1]:
        bk[x, FREQ] += 1


@njit(cache=True, inline="always")
def _in_ghost(bk: np.ndarray, g: np.ndarray, ip: np.ndarray, fp: np.ndarray, x: int) -> bool:
    if bk[x, AUX] == 0:
        return False
    ghost_size = max(1, int(fp[1] * ip[7]))  # ip[7] = capacity (set by the kernel)
    return g[G_GHOST] - bk[x, AUX] < ghost_size


@njit(cache=True, inline="always")
def insert(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, x: int) -> None:
    bk[x, FREQ] = 0
    if _in_ghost(bk, g, ip, fp, x):
        bk[x, AUX2] = _M
        bk[x, AUX] = 0
    else:
        bk[x, AUX2] = _S


@njit(cache=True, inline="always")
def release(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray,
            x: int, ref: int, pos: int, ntok: int, c: int, now: float) -> None:
    if bk[x, QID] < 0:
        q_append(bk, qs, bk[x, AUX2], x)


@njit(cache=True)
def _evict_small(bk: np.ndarray, g: np.ndarray, qs: np.ndarray, ip: np.ndarray) -> int:
    guard = qs[_S]
    while qs[_S] > 0:
        t = q_head(bk, qs, _S)
        q_unlink(bk, qs, t)
        if bk[t, PINNED] == 1:
            q_append(bk, qs, _S, t)
            guard -= 1
            if guard < 0:
                return -1
            continue
        if bk[t, FREQ] >= ip[0]:
            q_append(bk, qs, _M, t)
            continue
        g[G_GHOST] += 1
        bk[t, AUX] = g[G_GHOST]
        return t
    return -1


@njit(cache=True)
def _evict_main(bk: np.ndarray, qs: np.ndarray, ip: np.ndarray) -> int:
    guard = qs[_M] * (ip[1] + 2)
    while qs[_M] > 0:
        t = q_head(bk, qs, _M)
        q_unlink(bk, qs, t)
        guard -= 1
        if guard < 0:
            q_append(bk, qs, _M, t)
            return -1
        if bk[t, PINNED] == 1:
            q_append(bk, qs, _M, t)
            continue
        if bk[t, FREQ] > 0:
            bk[t, FREQ] -= 1
            q_append(bk, qs, _M, t)
            continue
        return t
    return -1


@njit(cache=True)
def evict(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, now: float) -> int:
    small_target = max(1, int(fp[0] * ip[7]))
    if qs[_S] >= small_target or qs[_M] == 0:
        x = _evict_small(bk, g, qs, ip)
        if x < 0:
            x = _evict_main(bk, qs, ip)
    else:
        x = _evict_main(bk, qs, ip)
        if x < 0:
            x = _evict_small(bk, g, qs, ip)
    return x


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
