"""ORACLE: Belady's MIN with prefix semantics, the offline upper bound.

    release(x) after request r: push x with key (-next_req(x after r), stamp++)
    evict():    pop the block whose next use is farthest in the future (never used again = infinitely far);
                ties (same next request): the earlier released, i.e. the deeper block of a request first

next_req of a reference = index of the next request that references the same chain id. A parent block
is used by every request that uses its child, so its next use is never later than the child's: the
oracle evicts children first and its cache stays prefix-closed, so its hits are exactly MIN's hits
on the request stream. With pinning (the current request's blocks are never victims) MIN is the
optimal demand policy for block hits, hence the upper bound for every policy here.

With `knows=dead` (the `oracle-dead` variant of `kvtrace simulate`) it knows less: only which blocks are
never used again (next_req = N). It evicts those first, least recently used first, then the others in
LRU order: the bound of any predictor of dead blocks added to LRU, so `oracle-dead - lru` is what
knowing *whether* a block returns is worth, and `oracle - oracle-dead` what knowing *when* adds. Its
cache stays prefix-closed (a parent is never used again only when its children are not either;
otherwise parent and child order as in LRU: deeper first on equal time).

Source: L. A. Belady, "A study of replacement algorithms for a virtual-storage computer", IBM Systems
Journal 5(2), 1966.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from tongyi_trace.sim import hooks
from tongyi_trace.sim.policy_base import NUM_PARAMS, InitContext, PolicySpec, Setup, StateDecl
from tongyi_trace.sim.stream import next_request_of_refs
from tongyi_trace.sim.structs import LAST, heap_pop_valid, heap_push

KNOWS = ("future", "dead")
IP_DEAD_ONLY, IP_NUM_REQUESTS = 0, 1
DEAD_FIRST = 1 << 62  # subtracted from a dead block's key (knows=dead): every dead block goes before any other


@dataclass(frozen=True)
class OracleParams:
    """What the oracle knows of the future."""

    knows: str = field(default="future", metadata={
        "help": "future: every next use (Belady); dead: only which blocks are never used again (LRU otherwise)"})

    def __post_init__(self) -> None:
        from tongyi_trace.errors import UsageError

        if self.knows not in KNOWS:
            raise UsageError(f"policy oracle: parameter knows must be one of {', '.join(KNOWS)}, got {self.knows!r}")

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(ip, fp) for the kernel (the number of requests is set by init)."""
        ip = np.zeros(NUM_PARAMS, np.int64)
        ip[IP_DEAD_ONLY] = int(self.knows == "dead")
        return ip, np.zeros(NUM_PARAMS, np.float64)


SPEC = PolicySpec("oracle", OracleParams, "Belady/MIN with prefix semantics (upper bound)")
PREFIX_CLOSED = True  # never evicts a parent before its children (module doc; kernel.py)
STATE = StateDecl()  # its heap (structs.py) breaks ties of equal keys: the earlier released first


def init(params: OracleParams, ctx: InitContext) -> Setup:
    """A heap over the cached blocks; `it` = the next use of each reference (ctx.next_req, computed when
    absent; the number of requests N when there is none)."""
    s = ctx.stream
    nxt = ctx.next_req if ctx.next_req is not None else next_request_of_refs(s.req_off, s.blk, s.num_ids)
    ip, fp = params.to_arrays()
    ip[IP_NUM_REQUESTS] = s.num_requests
    return Setup(ip, fp, it=nxt, heap_size=ctx.lazy_heap_entries)


access, insert = hooks.no_op, hooks.no_op  # shared hooks (sim/hooks.py)


@njit(cache=True, inline="always")
def release(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray,
            x: int, ref: int, pos: int, ntok: int, c: int, now: float) -> None:
    if ip[IP_DEAD_ONLY] == 1:  # dead first, then least recently used (LAST: stamped by the kernel)
        heap_push(bk, hp, g, x, bk[x, LAST] - (DEAD_FIRST if it[ref] >= ip[IP_NUM_REQUESTS] else 0))
    else:
        heap_push(bk, hp, g, x, -it[ref])


@njit(cache=True, inline="always")
def evict(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, now: float) -> int:
    return heap_pop_valid(bk, hp, g)[0]


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
