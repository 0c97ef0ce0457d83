"""ORACLE: Belady's MIN with prefix semantics, the offline upper bound.

    release(x) after request r: push x with key (-next_req(x after r), stamp++)
    evict():    pop the block whose next use is farthest in the future (never used again = infinitely far);
                ties (same next request): the earlier released, i.e. the deeper block of a request first

next_req of a reference = index of the next request that references the same chain id. A parent block
is used by every request that uses its child, so its next use is never later than the child's: the
oracle evicts children first and its cache stays prefix-closed, so its hits are exactly MIN's hits
on the request stream. With pinning (the current request's blocks are never victims) MIN is the
optimal demand policy for block hits, hence the upper bound for every policy here.

Source: L. A. Belady, "A study of replacement algorithms for a virtual-storage computer", IBM Systems
Journal 5(2), 1966.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
from numba import njit

from tongyi_trace.sim.policy_base import NoParams, PolicySpec
from tongyi_trace.sim.structs import G_STAMP, heap_pop_valid, heap_push

SPEC = PolicySpec("oracle", NoParams, "Belady/MIN with prefix semantics (upper bound)",
                  uses_heap=True, needs_next_use=True)


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
    g[G_STAMP] += 1
    heap_push(bk, hp, g, x, -nxt[ref], g[G_STAMP])


@njit(cache=True, inline="always")
def evict(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, now: float) -> int:
    return heap_pop_valid(bk, hp, g, gf)


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
