"""WA, the workload-aware policy of the paper (section 4.2): per-category queues ordered by last access;
to evict, compare only the W queue heads in the total order of tongyi_trace.wa_priority
(log ReuseProb_w(t, life), -offset, last access, block id) and drop the first.

    release(x) by a request of category w at time now: cat[x] = w; offset[x] = pos; append x to queue w
                (the kernel stamped last[x] = now; deepest first, so on equal time the deeper block is
                nearer the head)
    access(x):  unlink x (pinned while the request runs)
    evict(now): for each non-empty queue w: h = its head (its lowest priority: ReuseProb falls with t)
                    prio = log ReuseProb_w(now - last[h], life_w)   (tongyi_trace.wa_priority)
                victim = the head first in the total order (lowest prio, then deeper, older, smaller id)
    Reuse model per category (`model`): exp, F_w(d) = p_w (1 - e^(-lambda_w d)), or km, the censored
    Kaplan-Meier CDF tabulated by `kvtrace fit`; `conditional` divides by 1 - F_w(t); `life_s` > 0
    replaces every category's fitted life window (the capacity-aware fit sets it near the cache's
    eviction age); use_life=False (--wa-no-life) makes the window unbounded; use_offset=False
    (--wa-no-offset) drops the depth key. Categories unknown to the fit use its `default`.
    Prefix closure (leaf_only, on by default for WA) is the kernel's: see kernel.py.

The priority functions are the plain-Python ones of tongyi_trace/wa_priority.py compiled here with
numba, the same definitions the vLLM plugin runs. Cost: O(W) per eviction; a head's priority is
cached while it stays the head within one request (same now), so most evictions compute one log.

Source: Wang et al., "KVCache Cache in the Wild", USENIX ATC'25, section 4.2; vLLM PR #22236.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from types import FunctionType

import numpy as np
from numba import njit

from tongyi_trace import wa_priority
from tongyi_trace.guard.decide import GuardSettings
from tongyi_trace.sim.policy_base import PolicySpec
from tongyi_trace.sim.structs import (
    AUX,
    BPOS,
    CAT,
    G_QCACHE,
    G_STAMP,
    GF_NOW,
    GF_QCACHE,
    LAST,
    q_append,
    q_head,
    q_unlink,
)

km_cdf = njit(cache=True, inline="always")(wa_priority.km_cdf)
# log_reuse_prob calls km_cdf: compile it with the compiled km_cdf bound in its globals
log_reuse_prob = njit(cache=True, inline="always")(FunctionType(
    wa_priority.log_reuse_prob.__code__, {**vars(wa_priority), "km_cdf": km_cdf}, "log_reuse_prob"))
evicts_before = njit(cache=True, inline="always")(wa_priority.evicts_before)
# rows of the kernel's cw array (one column per category): p, rate, life, then the km table of F
CW_P, CW_RATE, CW_LIFE, CW_TABLE = 0, 1, 2, 3
NUM_CW_ROWS = CW_TABLE + wa_priority.KM_NUM
# ip slots: switches (to_arrays), and IP_LRU_ORDER: 1 = evict in LRU order across the queue heads (the
# head released longest ago: AUX holds each block's release stamp) instead of by priority; a driver (a
# guard) may flip it between slices of requests (sim.simulate.Cache.ip)
IP_USE_LIFE, IP_CONDITIONAL, IP_USE_OFFSET, IP_MODEL, IP_LRU_ORDER = 0, 1, 2, 3, 4


_GUARD = GuardSettings()


@dataclass(frozen=True)
class WaParams:
    """WA's switches (the fitted per-category parameters come from the policy file)."""

    model: str = field(default="exp", metadata={"help": "reuse model: exp (fitted p, lambda) or km (Kaplan-Meier)"})
    conditional: bool = field(default=False, metadata={
        "help": "condition on no reuse by t (--wa-conditional)"})
    life_s: float = field(default=0.0, metadata={
        "help": "life window for every category, s (0 = each category's fitted life_s)"})
    use_life: bool = field(default=True, metadata={"help": "lifespan regulator (off: --wa-no-life)"})
    use_offset: bool = field(default=True, metadata={"help": "deeper block first on ties (off: --wa-no-offset)"})
    # the guard and the online refit (tongyi_trace.guard; the kernel ignores them, a driver reads them);
    # defaults and validation: tongyi_trace.guard.decide.GuardSettings
    guard: bool = field(default=_GUARD.guard, metadata={
        "help": "shadow-LRU guard: switch to LRU order while a sampled LRU beats WA (tongyi_trace.guard)"})
    guard_margin: float = field(default=_GUARD.guard_margin, metadata={
        "help": "guard: switch when WA's sampled hit ratio trails LRU's by more than this, in points"})
    guard_window_s: float = field(default=_GUARD.guard_window_s, metadata={
        "help": "guard: the trace seconds over which both sampled hit ratios are compared"})
    refit_s: float = field(default=_GUARD.refit_s, metadata={
        "help": "online refit every this many trace seconds (0 = off)"})
    window_s: float = field(default=_GUARD.window_s, metadata={
        "help": "online refit: the sliding window of reuse samples, s"})
    sample_rate: float = field(default=_GUARD.sample_rate, metadata={
        "help": "guard and refit: share of blocks sampled by hash (SHARDS), in (0, 1]"})

    @property
    def guarded(self) -> bool:
        """Whether the guard or the online refit is on (a driver must serve the stream in slices)."""
        return self.guard or self.refit_s > 0

    def __post_init__(self) -> None:
        from tongyi_trace.errors import UsageError

        if self.model not in wa_priority.MODELS:
            raise UsageError(f"policy wa: parameter model must be one of {', '.join(wa_priority.MODELS)}, "
                             f"got {self.model!r}")
        if not (self.life_s >= 0.0 and self.life_s < float("inf")):
            raise UsageError(f"policy wa: parameter life_s must be a finite number >= 0, got {self.life_s}")
        self.guard_settings().check()

    def guard_settings(self) -> GuardSettings:
        """The guard's and the refit's parameters."""
        return GuardSettings(self.guard, self.guard_margin, self.guard_window_s, self.refit_s, self.window_s,
                             self.sample_rate)

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(ip, fp) for the kernel."""
        ip = np.zeros(8, np.int64)
        ip[IP_USE_LIFE] = int(self.use_life)
        ip[IP_CONDITIONAL] = int(self.conditional)
        ip[IP_USE_OFFSET] = int(self.use_offset)
        ip[IP_MODEL] = wa_priority.MODELS.index(self.model)
        fp = np.zeros(8, np.float64)
        fp[0] = self.life_s
        return ip, fp


SPEC = PolicySpec("wa", WaParams, "workload-aware (paper 4.2): per-category ReuseProb queues",
                  queues_per_category=True, needs_fit=True, leaf_only_default=True)


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
    bk[x, CAT] = c
    bk[x, BPOS] = pos
    g[G_STAMP] += 1
    bk[x, AUX] = g[G_STAMP]  # release order (the LRU order a guard may switch to)
    q_append(bk, qs, c, x)


@njit(cache=True)
def evict(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
          qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, now: float) -> int:
    use_life = ip[IP_USE_LIFE] == 1
    conditional = ip[IP_CONDITIONAL] == 1
    use_offset = ip[IP_USE_OFFSET] == 1
    model = ip[IP_MODEL]
    life_all = fp[0]
    nq = qs.shape[0]
    if ip[IP_LRU_ORDER] == 1:  # LRU across the queue heads (each queue is ordered by last access)
        best = -1
        for w in range(nq):
            if qs[w] == 0:
                continue
            h = q_head(bk, qs, w)
            if best < 0 or bk[h, AUX] < bk[best, AUX]:  # released longest ago
                best = h
        if best >= 0:
            q_unlink(bk, qs, best)
        return best
    if gf[GF_NOW] != now:  # a new request: every cached head priority is stale
        gf[GF_NOW] = now
        for w in range(nq):
            g[G_QCACHE + w] = -1
    best = -1
    best_prio = 0.0
    for w in range(nq):
        if qs[w] == 0:
            continue
        h = q_head(bk, qs, w)
        if g[G_QCACHE + w] == h:  # same head at the same time: same priority
            prio = gf[GF_QCACHE + w]
        else:
            life = life_all if life_all > 0.0 else cw[CW_LIFE, w]
            prio = log_reuse_prob(model, cw[CW_P, w], cw[CW_RATE, w], cw[CW_TABLE:, w],
                                  now - bk[h, LAST] * 1e-6, life, use_life, conditional)
            g[G_QCACHE + w] = h
            gf[GF_QCACHE + w] = prio
        if best < 0 or evicts_before(prio, bk[h, BPOS], bk[h, LAST], h,
                                     best_prio, bk[best, BPOS], bk[best, LAST], best, use_offset):
            best = h
            best_prio = prio
    if best >= 0:
        q_unlink(bk, qs, best)
    return best


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
