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

from tongyi_trace.sim.policy_base import InitContext, NoParams, PolicySpec, Setup, StateDecl
from tongyi_trace.sim.stream import next_request_of_refs
from tongyi_trace.sim.structs import heap_pop_valid, heap_push

SPEC = PolicySpec("oracle", NoParams, "Belady/MIN with prefix semantics (upper bound)")
STATE = StateDecl()  # its heap (structs.py) breaks ties of equal next uses: the earlier released first


def init(params: NoParams, ctx: InitContext) -> Setup:
    """A heap over the cached blocks; `it` = the next use of each reference (ctx.next_req, computed when
    absent)."""
    s = ctx.stream
    nxt = ctx.next_req if ctx.next_req is not None else next_request_of_refs(s.req_off, s.blk, s.num_ids)
    return Setup(*params.to_arrays(), it=nxt, heap_size=ctx.lazy_heap_entries)


@njit(cache=True, inline="always")
def access(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, x: int) -> None:
    pass


@njit(cache=True, inline="always")
def insert(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, x: int) -> None:
    pass


@njit(cache=True, inline="always")
def release(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray,
            x: int, ref: int, pos: int, ntok: int, c: int, now: float) -> None:
    heap_push(bk, hp, g, x, -it[ref])


@njit(cache=True, inline="always")
def evict(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, now: float) -> int:
    return heap_pop_valid(bk, hp, g)[0]


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
