"""LRU: evict the least recently used unpinned block.

    access(x):  unlink x from the queue (pinned while the request runs)
    release(x): append x at the newest end (called deepest-first, so the prefix head is most recent)
    evict():    pop the oldest block of the queue

Definition: least-recently-used replacement (textbook); with vLLM's ordering of a finished request's
blocks (vllm/v1/core/block_pool.py FreeKVCacheBlockQueue: freed tail-first), this is exactly vLLM's
prefix-cache eviction order.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
from numba import njit

from tongyi_trace.sim import hooks
from tongyi_trace.sim.policy_base import InitContext, NoParams, PolicySpec, Setup, StateDecl
from tongyi_trace.sim.structs import q_append, q_head, q_unlink

SPEC = PolicySpec("lru", NoParams, "least recently used (vLLM's order)")
PREFIX_CLOSED = True  # never evicts a parent before its children (module doc; kernel.py)
STATE = StateDecl()  # one queue, no fields of its own


def init(params: NoParams, ctx: InitContext) -> Setup:
    """One queue."""
    return Setup(*params.to_arrays())


access, insert = hooks.unlink, hooks.no_op  # shared hooks (sim/hooks.py)


@njit(cache=True, inline="always")
def release(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray,
            x: int, ref: int, pos: int, ntok: int, c: int, now: float) -> None:
    q_append(bk, qs, 0, x)


@njit(cache=True, inline="always")
def evict(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, now: float) -> int:
    x = q_head(bk, qs, 0)
    if x >= 0:
        q_unlink(bk, qs, x)
    return x


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
