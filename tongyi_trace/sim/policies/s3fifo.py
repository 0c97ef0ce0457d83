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
    fewer than |G| ids were added after it); a state per slot (structs.py) keeps their slots (`keeps`).
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
from dataclasses import dataclass

import numpy as np
from numba import njit

from tongyi_trace.policy.settings import S3FifoSettings
from tongyi_trace.sim.policy_base import NUM_PARAMS, InitContext, PolicySpec, Setup, StateDecl
from tongyi_trace.sim.structs import PINNED, QID, q_append, q_head, q_unlink

_S = 0
_M = 1


@dataclass(frozen=True)
class S3FifoParams(S3FifoSettings):
    """S3-FIFO's settings (tongyi_trace.policy.settings.S3FifoSettings, which the vLLM plugin runs too) with
    the kernel's arrays."""

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(ip, fp) for the kernel: the thresholds (the sizes in blocks are init's)."""
        ip = np.zeros(NUM_PARAMS, np.int64)
        ip[IP_MOVE] = self.move_to_main_threshold
        ip[IP_FREQ_CAP] = self.freq_cap
        return ip, np.zeros(NUM_PARAMS, np.float64)


# ip slots: the thresholds, then the queue sizes in blocks for one capacity (init)
IP_MOVE, IP_FREQ_CAP, IP_SMALL_BLOCKS, IP_GHOST_BLOCKS = range(4)
SPEC = PolicySpec("s3fifo", S3FifoParams, "S3-FIFO (SOSP'23): small + main FIFO + ghost")
STATE = StateDecl(columns={"FREQ": "hits since insertion, capped at freq_cap (0 on insertion)",
                           "GHOST": "ghost stamp: the value of GHOSTS when evicted from S (0 = never)",
                           "DEST": "the queue it joins at release: S (0) or M (1, it was in the ghost)"},
                  slots={"GHOSTS": "ids added to the ghost so far"})
FREQ = STATE.col("FREQ")
GHOST = STATE.col("GHOST")
DEST = STATE.col("DEST")
GHOSTS = STATE.slot("GHOSTS")


def retained(params: S3FifoParams, capacity_blocks: int) -> int:
    """The most evicted blocks the ghost G keeps at once at CAPACITY_BLOCKS (their slots stay taken)."""
    return max(1, int(params.ghost_ratio * capacity_blocks))


def init(params: S3FifoParams, ctx: InitContext) -> Setup:
    """Two queues (S, M); the small FIFO's target size and the ghost's size in blocks for this capacity (at
    most that many evicted blocks are in G: their slots are kept in a state per slot)."""
    ip, fp = params.to_arrays()
    ip[IP_SMALL_BLOCKS] = max(1, int(params.small_ratio * ctx.capacity_blocks))
    ip[IP_GHOST_BLOCKS] = retained(params, ctx.capacity_blocks)
    return Setup(ip, fp, num_queues=2, g0=np.zeros(1, np.int64), num_retained=int(ip[IP_GHOST_BLOCKS]))


@njit(cache=True, inline="always")
def access(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, x: int) -> None:
    if bk[x, FREQ] < ip[IP_FREQ_CAP]:
        bk[x, FREQ] += 1


@njit(cache=True, inline="always")
def _in_ghost(bk: np.ndarray, g: np.ndarray, ip: np.ndarray, x: int) -> bool:
    if bk[x, GHOST] == 0:
        return False
    return g[GHOSTS] - bk[x, GHOST] < ip[IP_GHOST_BLOCKS]


@njit(cache=True, inline="always")
def keeps(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
          qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, x: int) -> bool:
    """Whether the evicted block X is in G (its row is read when it is inserted again)."""
    return _in_ghost(bk, g, ip, x)


@njit(cache=True, inline="always")
def insert(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, x: int) -> None:
    bk[x, FREQ] = 0
    if _in_ghost(bk, g, ip, x):
        bk[x, DEST] = _M
        bk[x, GHOST] = 0
    else:
        bk[x, DEST] = _S


@njit(cache=True, inline="always")
def release(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray,
            x: int, ref: int, pos: int, ntok: int, c: int, now: float) -> None:
    if bk[x, QID] < 0:
        q_append(bk, qs, bk[x, DEST], x)


@njit(cache=True, inline="always")
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
        if bk[t, FREQ] >= ip[IP_MOVE]:
            q_append(bk, qs, _M, t)
            continue
        g[GHOSTS] += 1
        bk[t, GHOST] = g[GHOSTS]
        return t
    return -1


@njit(cache=True, inline="always")
def _evict_main(bk: np.ndarray, qs: np.ndarray, ip: np.ndarray) -> int:
    guard = qs[_M] * (ip[IP_FREQ_CAP] + 2)
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


@njit(cache=True, inline="always")
def evict(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, now: float) -> int:
    small_first = qs[_S] >= ip[IP_SMALL_BLOCKS] or qs[_M] == 0
    x = -1
    for i in range(2):  # the other queue when the first has no victim; each helper inlined once
        x = _evict_small(bk, g, qs, ip) if small_first == (i == 0) else _evict_main(bk, qs, ip)
        if x >= 0:
            break
    return x


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
