"""WA, the workload-aware policy of the paper (section 4.2): per-category queues ordered by last access;
to evict, compare only the W queue heads by (ReuseProb_w(t, life), -offset) and drop the lowest.

    release(x) by a request of category w at time now: last[x] = now (in microseconds); cat[x] = w;
                offset[x] = pos; append x to queue w (deepest first: on equal time the deeper block is
                nearer the head)
    access(x):  unlink x (pinned while the request runs)
    evict(now): for each non-empty queue w: h = its head (its lowest priority: ReuseProb falls with t)
                    prob = ReuseProb_w(now - last[h], life_w)     (tongyi_trace.wa_priority.reuse_prob)
                victim = the head that evicts_before all others (lower prob; equal prob: larger offset)
    ReuseProb_w(t, life) = p_w exp(-lambda_w t) (1 - exp(-lambda_w life)); categories unknown to the fit
    use its `default`. Switches: use_life=False (--wa-no-life: window unbounded), conditional=True
    (--wa-conditional: divide by 1 - F_w(t)), use_offset=False (--wa-no-offset: no depth tie-break).

The priority functions are the plain-Python ones of tongyi_trace/wa_priority.py compiled here with
numba, the same definitions the vLLM plugin runs. Cost: O(W) per eviction; a head's priority is
cached while it stays the head within one request (same now), so most evictions compute one exp.

Source: Wang et al., "KVCache Cache in the Wild", USENIX ATC'25, section 4.2; vLLM PR #22236.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from tongyi_trace import wa_priority
from tongyi_trace.sim.policy_base import PolicySpec
from tongyi_trace.sim.structs import AUX, BPOS, CAT, G_QCACHE, GF_NOW, GF_QCACHE, q_append, q_head, q_unlink

PID = 5
reuse_prob = njit(cache=True, inline="always")(wa_priority.reuse_prob)
evicts_before = njit(cache=True, inline="always")(wa_priority.evicts_before)


@dataclass(frozen=True)
class WaParams:
    """Ablation switches of WA (the fitted per-category parameters come from --params)."""

    use_life: bool = field(default=True, metadata={"help": "lifespan regulator (off: --wa-no-life)"})
    conditional: bool = field(default=False, metadata={
        "help": "condition on no reuse by t (--wa-conditional)"})
    use_offset: bool = field(default=True, metadata={"help": "deeper block first on ties (off: --wa-no-offset)"})

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(ip, fp) for the kernel."""
        ip = np.zeros(8, np.int64)
        ip[0] = int(self.use_life)
        ip[1] = int(self.conditional)
        ip[2] = int(self.use_offset)
        return ip, np.zeros(8, np.float64)


SPEC = PolicySpec("wa", PID, WaParams, "workload-aware (paper 4.2): per-category ReuseProb queues",
                  queues_per_category=True, needs_fit=True)


@njit(cache=True, inline="always")
def access(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, x: int) -> None:
    q_unlink(bk, qs, x)


@njit(cache=True, inline="always")
def insert(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, x: int) -> None:
    pass


@njit(cache=True, inline="always")
def release(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray,
            x: int, ref: int, pos: int, ntok: int, c: int, now: float) -> None:
    bk[x, AUX] = np.int64(now * 1e6)  # last access in microseconds, in the block's row (one memory line)
    bk[x, CAT] = c
    bk[x, BPOS] = pos
    q_append(bk, qs, c, x)


@njit(cache=True)
def evict(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
          qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, now: float) -> int:
    use_life = ip[0] == 1
    conditional = ip[1] == 1
    use_offset = ip[2] == 1
    if gf[GF_NOW] != now:  # a new request: every cached head priority is stale
        gf[GF_NOW] = now
        for w in range(qs.shape[0]):
            g[G_QCACHE + w] = -1
    best = -1
    best_prob = 0.0
    best_off = 0
    for w in range(qs.shape[0]):
        if qs[w] == 0:
            continue
        h = q_head(bk, qs, w)
        nq = qs.shape[0]
        if g[G_QCACHE + w] == h:  # same head at the same time: same priority (no block row read)
            prob = gf[GF_QCACHE + w]
            off = g[G_QCACHE + nq + w]
        else:
            prob = reuse_prob(cw[0, w], cw[1, w], now - bk[h, AUX] * 1e-6, cw[2, w], use_life, conditional)
            off = bk[h, BPOS]
            g[G_QCACHE + w] = h
            gf[GF_QCACHE + w] = prob
            g[G_QCACHE + nq + w] = off
        if best < 0 or evicts_before(prob, off, best_prob, best_off, use_offset):
            best = h
            best_prob = prob
            best_off = off
    if best >= 0:
        q_unlink(bk, qs, best)
    return best


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
