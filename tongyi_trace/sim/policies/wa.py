"""WA, the workload-aware policy of the paper (section 4.2): per-category queues ordered by last access;
to evict, compare only the W queue heads in the total order of tongyi_trace.policy.wa_priority
(log ReuseProb_w(t, life), -offset, last access, block key = the block id, structs.BID) and drop the first.

    release(x) by a request of category w at time now: cat[x] = w; offset[x] = pos; append x to queue w
                (the kernel stamped last[x] = now; deepest first, so on equal time the deeper block is
                nearer the head)
    access(x):  unlink x (pinned while the request runs)
    evict(now): for each non-empty queue w: h = its head (its lowest priority: ReuseProb falls with t)
                    prio = log ReuseProb_w(now - last[h], life_w)   (tongyi_trace.policy.wa_priority)
                victim = the head first in the total order (lowest prio, then deeper, older, smaller id)
    Reuse model per category (`model`): exp, F_w(d) = p_w (1 - e^(-lambda_w d)), or km, the censored
    Kaplan-Meier CDF tabulated by `kvtrace fit`; `conditional` divides by 1 - F_w(t); `life_s` > 0
    replaces every category's fitted life window (the capacity-aware fit sets it near the cache's
    eviction age); use_life=False (--wa-no-life) makes the window unbounded; use_offset=False
    (--wa-no-offset) drops the depth key. Categories unknown to the fit use its `default`.
    Prefix closure (leaf_only, on by default for WA) is the kernel's: see kernel.py.

The priority functions are the plain-Python ones of tongyi_trace/policy/wa_priority.py compiled here with
numba, the same definitions the vLLM plugin runs.

Cost: the W heads' priorities change with `now` only, so they are computed once per request that evicts
(with the exp model one multiply each: its log terms are kept per category, wa_priority.exp_terms),
and a tournament tree over the queues (a winner tree: each node holds the queue whose head comes first
below it, the root the victim's) finds the victim. A head that leaves its queue (evicted, or accessed:
the hooks see it) or a queue that fills again marks its leaf stale; the next eviction recomputes the
stale leaves and their paths to the root, log2(W) comparisons each, instead of comparing all W heads.
Anything else that changes the queues or the parameters (kernel.promote, a driver's Cache.changed)
bumps structs.G_EPOCH, and the tree and the terms are built again. The victim is the minimum of the
same total order either way, so the order is exactly the linear scan's (and the plugin's).

Source: Wang et al., "KVCache Cache in the Wild", USENIX ATC'25, section 4.2; vLLM PR #22236.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import FunctionType
from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from tongyi_trace.policy import wa_priority
from tongyi_trace.policy.settings import WaSettings
from tongyi_trace.sim import hooks
from tongyi_trace.sim.policy_base import NUM_PARAMS, InitContext, PolicySpec, Setup, StateDecl
from tongyi_trace.sim.structs import BID, G_EPOCH, LAST, QID, q_append, q_head, q_unlink

if TYPE_CHECKING:
    from tongyi_trace.policy.file import PolicyParams

km_cdf = njit(cache=True, inline="always")(wa_priority.km_cdf)
exp_terms = njit(cache=True, inline="always")(wa_priority.exp_terms)
exp_log_reuse_prob = njit(cache=True, inline="always")(wa_priority.exp_log_reuse_prob)
# log_reuse_prob calls those: compile it with the compiled ones bound in its globals. It and _terms (once per
# epoch) are called, not inlined: numba's inlining copies a function's IR with its whole scope once per
# block, so a large inlined callee costs its caller's compile quadratically (WA's loop: 11.5 -> 8.4 CPU s
# cold, bench/bench_compile.py); a call with scalars and a row costs little beside the priority's logs. Not
# cached on their own (cache=False): compiled afresh with the loop, whose cache entry holds their code, so
# they never run stale against an edited structs.py or policy_base.py (kernel.policy_kernel)
log_reuse_prob = njit(cache=False)(FunctionType(
    wa_priority.log_reuse_prob.__code__, {**vars(wa_priority), "km_cdf": km_cdf, "exp_terms": exp_terms,
                                          "exp_log_reuse_prob": exp_log_reuse_prob}, "log_reuse_prob"))
evicts_before = njit(cache=True, inline="always")(wa_priority.evicts_before)
# rows of WA's float table ft (sim.simulate.Cache.cw; one column per category): p, rate, life, then the
# km table of F
CW_P, CW_RATE, CW_LIFE, CW_TABLE = 0, 1, 2, 3
NUM_CW_ROWS = CW_TABLE + wa_priority.KM_NUM
# ip slots: switches (to_arrays), and IP_LRU_ORDER: 1 = evict in LRU order across the queue heads (the
# head released longest ago: the STAMP column) instead of by priority; a driver (a guard) may flip it
# between slices of requests (sim.simulate.Cache.ip); fp[FP_LIFE] = life_s
# IP_LEAVES: the tournament tree's leaves, the queues rounded up to a power of 2 (init)
IP_USE_LIFE, IP_CONDITIONAL, IP_USE_OFFSET, IP_MODEL, IP_LRU_ORDER, IP_LEAVES = 0, 1, 2, 3, 4, 5
FP_LIFE = 0


@dataclass(frozen=True)
class WaParams(WaSettings):
    """WA's settings (tongyi_trace.policy.settings.WaSettings) with the kernel's arrays (the fitted
    per-category parameters come from the policy file)."""

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(ip, fp) for the kernel."""
        ip = np.zeros(NUM_PARAMS, np.int64)
        ip[IP_USE_LIFE] = int(self.use_life)
        ip[IP_CONDITIONAL] = int(self.conditional)
        ip[IP_USE_OFFSET] = int(self.use_offset)
        ip[IP_MODEL] = wa_priority.MODELS.index(self.model)
        fp = np.zeros(NUM_PARAMS, np.float64)
        fp[FP_LIFE] = self.life_s
        return ip, fp


SPEC = PolicySpec("wa", WaParams, "workload-aware (paper 4.2): per-category ReuseProb queues",
                  needs_fit=True, leaf_only_default=True)
STATE = StateDecl(
    columns={"CAT": "category of the last request that released the block (its queue)",
             "BPOS": "block position (offset) in that request",
             "STAMP": "release stamp: the value of RELEASES when released (the LRU order IP_LRU_ORDER uses)"},
    slots={"RELEASES": "releases so far",
           "EPOCH": "the structs.G_EPOCH the tree was built at",
           "NDIRTY": "stale leaves listed in DIRTY",
           "QHEAD": "per queue: the head whose key leaf w of the tree holds (EMPTY: the queue was empty; "
                    "STALE: listed in DIRTY, to recompute); then per queue DIRTY, the stale queues; then "
                    "TREE, 2 x ip[IP_LEAVES] nodes: node 1 is the root, node IP_LEAVES + w the leaf of queue "
                    "w, node i's children 2i and 2i + 1, each node the queue whose head comes first in the "
                    "eviction order below it (-1: none)"},
    fslots={"NOW": "the time the tree's priorities were computed for (nan = never)",
            "LOGP": "per queue: the exp model's terms of its category (wa_priority.exp_terms) for the "
                    "parameters of EPOCH, LOGP then per queue LOGW; then NODEP, per node of TREE the "
                    "priority of its queue's head (+inf: none; a leaf's is its queue head's, at NOW)"})
CAT = STATE.col("CAT")
BPOS = STATE.col("BPOS")
STAMP = STATE.col("STAMP")
RELEASES = STATE.slot("RELEASES")
EPOCH = STATE.slot("EPOCH")
NDIRTY = STATE.slot("NDIRTY")
QHEAD = STATE.slot("QHEAD")
NOW = STATE.fslot("NOW")
LOGP = STATE.fslot("LOGP")
EMPTY, STALE = -2, -1  # QHEAD values that are not a head


def init(params: WaParams, ctx: InitContext) -> Setup:
    """One queue per category of the stream; ft = category_table (the policy file's parameters)."""
    nq = max(len(ctx.stream.categories), 1)
    ip, fp = params.to_arrays()
    leaves = 1 << (nq - 1).bit_length()
    ip[IP_LEAVES] = leaves
    g0 = np.concatenate([[0, -1, 0], np.full(nq, STALE), np.zeros(nq), np.full(2 * leaves, -1)])
    return Setup(ip, fp, ft=category_table(ctx.stream.categories, ctx.fit), num_queues=nq,
                 g0=g0.astype(np.int64), gf0=np.concatenate([[np.nan], np.zeros(2 * nq), np.full(2 * leaves, np.inf)]))


def category_table(categories: Sequence[str], fit: PolicyParams | None) -> np.ndarray:
    """WA's per-category parameters as its float table: rows p, rate_per_s, life_s and the km table of F
    (CW_*), one column per category of CATEGORIES (the fit's `default` when unknown to it)."""
    cw = np.zeros((NUM_CW_ROWS, max(len(categories), 1)))
    if fit is not None:
        for i, name in enumerate(categories):
            c = fit.for_category(name)
            cw[CW_P, i], cw[CW_RATE, i], cw[CW_LIFE, i] = c.reuse_prob, c.rate_per_s, c.life_s
            cw[CW_TABLE:, i] = c.km_cdf_table()
    return cw


insert = hooks.no_op  # shared hook (sim/hooks.py)


@njit(cache=True, inline="always")
def _stale(g: np.ndarray, nq: int, q: int) -> None:
    """Leaf Q of the tree (of NQ queues) is to be recomputed: listed in DIRTY, once."""
    if g[QHEAD + q] != STALE:
        g[QHEAD + q] = STALE
        g[QHEAD + nq + g[NDIRTY]] = q
        g[NDIRTY] += 1


@njit(cache=True, inline="always")
def _leave(bk: np.ndarray, g: np.ndarray, qs: np.ndarray, x: int) -> None:
    """X leaves its queue (if in one): when it is the head a leaf holds, that leaf is stale."""
    q = bk[x, QID]
    if q >= 0 and g[QHEAD + q] == x:
        _stale(g, qs.shape[0], q)
    q_unlink(bk, qs, x)


@njit(cache=True, inline="always")
def access(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, x: int) -> None:
    _leave(bk, g, qs, x)


@njit(cache=True, inline="always")
def release(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray,
            x: int, ref: int, pos: int, ntok: int, c: int, now: float) -> None:
    bk[x, CAT] = c
    bk[x, BPOS] = pos
    g[RELEASES] += 1
    bk[x, STAMP] = g[RELEASES]
    if g[QHEAD + c] == EMPTY:  # the queue gets a head
        _stale(g, qs.shape[0], c)
    q_append(bk, qs, c, x)


@njit(cache=True, inline="always")
def _leaf(bk: np.ndarray, g: np.ndarray, gf: np.ndarray, qs: np.ndarray, ip: np.ndarray, fp: np.ndarray,
          ft: np.ndarray, w: int, now: float) -> tuple[int, float]:
    """Key queue W's head at NOW into its leaf (QHEAD, TREE, NODEP); return (W, the head's priority), or
    (-1, +inf) when the queue is empty."""
    nq = qs.shape[0]
    i = ip[IP_LEAVES] + w
    h = q_head(bk, qs, w)
    if h < 0:
        g[QHEAD + w] = EMPTY
        g[QHEAD + 2 * nq + i] = -1
        gf[LOGP + 2 * nq + i] = np.inf
        return -1, np.inf
    t_s = now - bk[h, LAST] * 1e-6
    if ip[IP_MODEL] == wa_priority.MODEL_EXP:  # with its terms, kept per category (_terms)
        prio = exp_log_reuse_prob(gf[LOGP + w], gf[LOGP + nq + w], ft[CW_P, w], ft[CW_RATE, w], t_s,
                                  ip[IP_USE_LIFE] == 1, ip[IP_CONDITIONAL] == 1)
    else:
        prio = log_reuse_prob(ip[IP_MODEL], ft[CW_P, w], ft[CW_RATE, w], ft[CW_TABLE:, w], t_s, _life(fp, ft, w),
                              ip[IP_USE_LIFE] == 1, ip[IP_CONDITIONAL] == 1)
    g[QHEAD + w] = h
    g[QHEAD + 2 * nq + i] = w
    gf[LOGP + 2 * nq + i] = prio
    return w, prio


@njit(cache=True, inline="always")
def _life(fp: np.ndarray, ft: np.ndarray, w: int) -> float:
    """Category W's life window, s."""
    return fp[FP_LIFE] if fp[FP_LIFE] > 0.0 else ft[CW_LIFE, w]


@njit(cache=False)  # called, not inlined (log_reuse_prob above)
def _terms(gf: np.ndarray, nq: int, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray) -> None:
    """Each category's exp terms (LOGP, LOGW) for the current parameters."""
    for w in range(nq):
        gf[LOGP + w], gf[LOGP + nq + w] = exp_terms(ft[CW_P, w], ft[CW_RATE, w], _life(fp, ft, w),
                                                               ip[IP_USE_LIFE] == 1)


@njit(cache=True, inline="always")
def _first(bk: np.ndarray, g: np.ndarray, a: int, pa: float, b: int, pb: float, use_offset: bool) -> bool:
    """Whether queue A (its head's priority PA; -1 and +inf: none) comes before queue B (PB) in the eviction
    order: the priorities decide, a tie (rare) reads the heads' other keys."""
    if pa != pb:
        return pa < pb
    if a < 0 or b < 0:
        return b < 0 <= a
    ha = g[QHEAD + a]
    hb = g[QHEAD + b]
    return evicts_before(pa, bk[ha, BPOS], bk[ha, LAST], bk[ha, BID], pb, bk[hb, BPOS], bk[hb, LAST], bk[hb, BID],
                         use_offset)


@njit(cache=True, inline="always")
def evict(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
          qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, now: float) -> int:
    nq = qs.shape[0]
    if ip[IP_LRU_ORDER] == 1:  # LRU across the queue heads (each queue is ordered by last access)
        best = -1
        for w in range(nq):
            if qs[w] == 0:
                continue
            h = q_head(bk, qs, w)
            if best < 0 or bk[h, STAMP] < bk[best, STAMP]:  # released longest ago
                best = h
        if best >= 0:
            _leave(bk, g, qs, best)
        return best
    use_offset = ip[IP_USE_OFFSET] == 1
    leaves = ip[IP_LEAVES]
    tree = QHEAD + 2 * nq
    nodep = LOGP + 2 * nq
    build = gf[NOW] != now or g[EPOCH] != g[G_EPOCH]  # every priority changed, or something behind the hooks
    if build:  # every leaf is stale: the tree is built again
        gf[NOW] = now
        if g[EPOCH] != g[G_EPOCH]:
            _terms(gf, nq, ip, fp, ft)
            g[EPOCH] = g[G_EPOCH]
        for w in range(nq):
            g[QHEAD + nq + w] = w
        g[NDIRTY] = nq
    # the stale leaves keyed first (one call site of _leaf, so its priority functions compile once: each
    # node is the first of its subtree whatever order the leaves are keyed in)
    for k in range(g[NDIRTY]):
        _leaf(bk, g, gf, qs, ip, fp, ft, g[QHEAD + nq + k], now)
    if build:
        for i in range(leaves - 1, 0, -1):
            a, b = tree + 2 * i, nodep + 2 * i
            right = _first(bk, g, g[a + 1], gf[b + 1], g[a], gf[b], use_offset)
            g[tree + i] = g[a + 1] if right else g[a]
            gf[nodep + i] = gf[b + 1] if right else gf[b]
    else:  # the stale leaves' paths (the winner carried up, each sibling's key read)
        for k in range(g[NDIRTY]):
            i = leaves + g[QHEAD + nq + k]
            win, wp = g[tree + i], gf[nodep + i]
            while i > 1:
                s = g[tree + (i ^ 1)]
                sp = gf[nodep + (i ^ 1)]
                if _first(bk, g, s, sp, win, wp, use_offset):
                    win, wp = s, sp
                i >>= 1
                g[tree + i] = win
                gf[nodep + i] = wp
    g[NDIRTY] = 0
    w = g[tree + 1]
    if w < 0:
        return -1
    best = g[QHEAD + w]
    _stale(g, nq, w)
    q_unlink(bk, qs, best)
    return best


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
