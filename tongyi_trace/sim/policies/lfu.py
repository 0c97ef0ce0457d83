"""LFU: evict the unpinned block with the fewest accesses since it entered the cache; LRU among equals.

    insert(x):  freq[x] = 1
    access(x):  freq[x] += 1; invalidate x's heap entry (pinned)
    release(x): push x with key (freq[x], stamp++)   (deepest-first: the deeper block gets the lower stamp)
    evict():    pop the smallest valid key

Definition: least-frequently-used with in-cache frequency (libCacheSim LFU.c); ties broken by recency.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
from numba import njit

from tongyi_trace.sim.policy_base import NoParams, PolicySpec
from tongyi_trace.sim.structs import FREQ, G_STAMP, heap_pop_valid, heap_push

PID = 2
SPEC = PolicySpec("lfu", PID, NoParams, "least frequently used (in-cache count), LRU among equal counts",
                  uses_heap=True)


@njit(cache=True, inline="always")
def access(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, x: int) -> None:
    bk[x, FREQ] += 1


@njit(cache=True, inline="always")
def insert(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, x: int) -> None:
    bk[x, FREQ] = 1


@njit(cache=True, inline="always")
def release(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray,
            x: int, ref: int, pos: int, ntok: int, c: int, now: float) -> None:
    g[G_STAMP] += 1
    heap_push(bk, hp, g, x, bk[x, FREQ], g[G_STAMP])


@njit(cache=True, inline="always")
def evict(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, now: float) -> int:
    return heap_pop_valid(bk, hp, g, gf)


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
