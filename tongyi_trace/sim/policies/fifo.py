"""FIFO: evict the block that entered the cache first; hits do not reorder.

    access(x):  nothing (x keeps its place; it is pinned so eviction skips it)
    release(x): if x is new (in no queue): append x at the newest end (deepest-first)
    evict():    walk from the oldest end, skipping pinned blocks (a per-request cursor
                remembers the pinned run already skipped), unlink and return the first unpinned one

Definition: first-in-first-out replacement (textbook; libCacheSim FIFO.c).
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
from numba import njit

from tongyi_trace.sim.policy_base import NoParams, PolicySpec
from tongyi_trace.sim.structs import G_CURSOR, PINNED, QID, q_append, q_head, q_next, q_unlink

SPEC = PolicySpec("fifo", NoParams, "first in, first out; hits do not reorder")


@njit(cache=True, inline="always")
def access(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, x: int) -> None:
    pass


@njit(cache=True, inline="always")
def insert(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, x: int) -> None:
    pass


@njit(cache=True, inline="always")
def release(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray,
            x: int, ref: int, pos: int, ntok: int, c: int, now: float) -> None:
    if bk[x, QID] < 0:
        q_append(bk, qs, 0, x)


@njit(cache=True)
def evict(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, now: float) -> int:
    cur = g[G_CURSOR]
    x = q_head(bk, qs, 0) if cur < 0 else q_next(bk, qs, cur)
    while x >= 0:
        if bk[x, PINNED] == 0:
            q_unlink(bk, qs, x)
            return x
        g[G_CURSOR] = x
        x = q_next(bk, qs, x)
    return -1


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
