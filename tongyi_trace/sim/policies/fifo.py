"""FIFO: evict the block that entered the cache first; hits do not reorder.

    access(x):  nothing (x keeps its place; it is pinned so eviction skips it)
    release(x): forget the cursor; if x is new (in no queue): append x at the newest end (deepest-first)
    evict():    unlink and return the oldest block when it is not pinned; else walk on from there,
                skipping pinned blocks (a cursor remembers the pinned run already skipped while the
                request runs), to the first unpinned one. The common case reads no cursor: reading it
                on every eviction cost FIFO a quarter of its speed.

Definition: first-in-first-out replacement (textbook; libCacheSim FIFO.c).
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
from numba import njit

from tongyi_trace.sim import hooks
from tongyi_trace.sim.policy_base import InitContext, NoParams, PolicySpec, Setup, StateDecl
from tongyi_trace.sim.structs import PINNED, QID, q_append, q_head, q_next, q_unlink

SPEC = PolicySpec("fifo", NoParams, "first in, first out; hits do not reorder")
STATE = StateDecl(slots={"CURSOR": "the last pinned block the eviction walk of the running request skipped "
                                   "(-1 = walk from the head); release (the request is served) resets it"})
CURSOR = STATE.slot("CURSOR")


def init(params: NoParams, ctx: InitContext) -> Setup:
    """One queue, no cursor."""
    return Setup(*params.to_arrays(), g0=np.array([-1], np.int64))


access, insert = hooks.no_op, hooks.no_op  # shared hooks (sim/hooks.py)


@njit(cache=True, inline="always")
def release(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray,
            x: int, ref: int, pos: int, ntok: int, c: int, now: float) -> None:
    g[CURSOR] = -1
    if bk[x, QID] < 0:
        q_append(bk, qs, 0, x)


@njit(cache=True, inline="always")
def evict(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, now: float) -> int:
    x = q_head(bk, qs, 0)
    if x >= 0 and bk[x, PINNED] == 0:
        q_unlink(bk, qs, x)
        return x
    cur = g[CURSOR]
    if cur >= 0:
        x = q_next(bk, qs, cur)
    while x >= 0:
        if bk[x, PINNED] == 0:
            q_unlink(bk, qs, x)
            return x
        g[CURSOR] = x
        x = q_next(bk, qs, x)
    return -1


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
