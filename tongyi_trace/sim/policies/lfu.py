"""LFU: evict the unpinned block with the fewest accesses since it entered the cache; LRU among equals.

    insert(x):  freq[x] = 1
    access(x):  freq[x] += 1; unlink x from its bucket (pinned)
    release(x): append x to bucket freq[x] (buckets are LRU queues: deepest first, so the deeper block of
                a request goes first among equals); min = min(min, freq[x])
    evict():    advance min to the lowest non-empty bucket; pop its oldest block
One bucket per possible count (the stream's largest per-block reference count + 1), so the order is exact
(count, then recency) and every operation is O(1) amortized (min only moves up between releases).

Definition: least-frequently-used with in-cache frequency (libCacheSim LFU.c); ties broken by recency.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
from numba import njit

from tongyi_trace.sim.policy_base import InitContext, NoParams, PolicySpec, Setup, StateDecl
from tongyi_trace.sim.structs import q_append, q_head, q_unlink

SPEC = PolicySpec("lfu", NoParams, "least frequently used (in-cache count), LRU among equal counts")
STATE = StateDecl(columns={"FREQ": "references since the block entered the cache (1 on insertion)"},
                  slots={"MINF": "no non-empty bucket below this count"})
FREQ = STATE.col("FREQ")
MINF = STATE.slot("MINF")


def init(params: NoParams, ctx: InitContext) -> Setup:
    """One bucket (queue) per possible count: the stream's largest per-block reference count + 2."""
    num_queues = int(np.bincount(ctx.stream.blk, minlength=1).max()) + 2
    return Setup(*params.to_arrays(), num_queues=num_queues, g0=np.zeros(1, np.int64))


@njit(cache=True, inline="always")
def access(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, x: int) -> None:
    bk[x, FREQ] += 1
    q_unlink(bk, qs, x)


@njit(cache=True, inline="always")
def insert(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, x: int) -> None:
    bk[x, FREQ] = 1


@njit(cache=True, inline="always")
def release(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray,
            x: int, ref: int, pos: int, ntok: int, c: int, now: float) -> None:
    f = min(bk[x, FREQ], qs.shape[0] - 1)
    q_append(bk, qs, f, x)
    if f < g[MINF]:
        g[MINF] = f


@njit(cache=True, inline="always")
def evict(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
          qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, now: float) -> int:
    m = g[MINF]
    nq = qs.shape[0]
    while m < nq and qs[m] == 0:
        m += 1
    if m == nq:
        g[MINF] = nq
        return -1
    g[MINF] = m
    x = q_head(bk, qs, m)
    q_unlink(bk, qs, x)
    return x


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
