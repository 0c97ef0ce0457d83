"""GDSF (GreedyDual-Size-Frequency): evict the block with the lowest clock + frequency x cost / size.

    insert(x):  freq[x] = 1
    access(x):  freq[x] += 1 (pinned)
    release(x): hp[x] = L + freq[x] * cost(x) / size(x); push x with key (hp[x], stamp++)
    evict():    pop the smallest hp; L = hp of the victim   (the clock only grows)

cost(x) / size(x) for a KV block = the prefill work per token of recomputing it, by position:
    cost/size = 1 + (start_token + num_tokens / 2) / attn_scale_tokens
i.e. a linear (MLP/projection) term of 1 per token plus attention over the block's context
(start_token = pos x block_size), whose per-token cost equals the linear term at attn_scale_tokens of
context (about 2 x params / (4 x layers x hidden) tokens: ~37k for Qwen2-7B; default 32768).
Size is counted in tokens, so a partial last block is cheaper to keep.

Source: Cherkasova, "Improving WWW proxies performance with Greedy-Dual-Size-Frequency caching
policy", HP Labs 1998; the paper's baseline ("clock + frequency x cost / size"); libCacheSim GDSF.c.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from tongyi_trace.sim.policy_base import NUM_PARAMS, InitContext, PolicySpec, Setup, StateDecl
from tongyi_trace.sim.structs import G_HSTAMP, HKEY, HOFF, HTIE, HVER, ID_MASK, entry_valid, prefetch_row

KEY_SCALE = 2.0**32  # heap keys are int64: H is kept to 2^-32 (ties within that are broken by recency)


@dataclass(frozen=True)
class GdsfParams:
    """GDSF's recompute-cost model."""

    attn_scale_tokens: float = field(default=32768.0, metadata={
        "help": "context length at which attention costs as much per token as the linear layers"})
    block_size_tokens: float = field(default=0.0, metadata={
        "help": "tokens per block for start_token (0 = the simulated block size)"})

    def __post_init__(self) -> None:
        from tongyi_trace.errors import UsageError

        if not self.attn_scale_tokens > 0 or self.block_size_tokens < 0:
            raise UsageError("policy gdsf: attn_scale_tokens must be > 0 and block_size_tokens >= 0")

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(ip, fp) for the kernel: fp[FP_ATTN_SCALE], fp[FP_BLOCK_SIZE]."""
        fp = np.zeros(NUM_PARAMS, np.float64)
        fp[FP_ATTN_SCALE] = self.attn_scale_tokens
        fp[FP_BLOCK_SIZE] = self.block_size_tokens
        return np.zeros(NUM_PARAMS, np.int64), fp


FP_ATTN_SCALE, FP_BLOCK_SIZE = 0, 1  # fp slots
SPEC = PolicySpec("gdsf", GdsfParams, "GreedyDual-Size-Frequency, cost = recompute cost by position")
STATE = StateDecl(columns={"FREQ": "references since the block entered the cache (1 on insertion)"},
                  slots={"NRUNS": "runs in the run heap",
                         "TAIL": "entries written to the arena (hp rows 0..TAIL-1)",
                         "PEND": "first arena row of the run being released (-1: none)",
                         "LAST_REF": "the reference of the last release (releases of one request descend)"},
                  fslots={"CLOCK": "the inflation value L: the priority of the last victim"})
FREQ = STATE.col("FREQ")
NRUNS, TAIL, PEND, LAST_REF = (STATE.slot(n) for n in ("NRUNS", "TAIL", "PEND", "LAST_REF"))
CLOCK = STATE.fslot("CLOCK")
# The priority queue: runs, not one heap. A request's releases (one per block, all at the same clock) form
# one run of entries (HKEY, HTIE = push stamp << 32 | block) in the arena hp, sorted by (key, stamp) when
# the run is closed (at the next eviction or request; early when an entry would have to move more than
# MAX_SHIFT places to keep it sorted); a small binary heap orders the runs by their first remaining
# entry. An eviction takes the smallest head, so entries leave in (key, stamp) order exactly as from one
# heap, but each costs a sift in a heap of runs (a few hundred to thousands, cache resident) instead of one
# over every entry. Entries stale since (the block was referenced again, i.e. has a newer stamp in HVER,
# or left the cache, or is pinned) are skipped, as structs' lazy heap does. When the arena is full, the
# valid entries are moved to its front (run by run). The int table it holds, per run (indexed by the
# run's first arena row): RUN_END, RUN_CUR (its next entry); then the run heap: per slot the run (its first
# arena row) and the key and tie of its next entry (so that sifting reads only the run heap).
RUN_END, RUN_CUR, RH_RUN, RH_KEY, RH_TIE = range(5)  # blocks of `it`, each hp.shape[0] long
MAX_SHIFT = 16


def init(params: GdsfParams, ctx: InitContext) -> Setup:
    """The arena (the cached blocks, two longest requests, as many stale entries between compactions: the
    lazy heap's size) and the run tables; block_size_tokens 0 becomes the stream's block size."""
    ip, fp = params.to_arrays()
    if fp[FP_BLOCK_SIZE] <= 0:
        fp[FP_BLOCK_SIZE] = float(ctx.stream.block_size)
    size = ctx.lazy_heap_entries
    return Setup(ip, fp, it=np.zeros(5 * (size + HOFF), np.int64), heap_size=size,
                 g0=np.array([0, 0, -1, 0], np.int64), gf0=np.zeros(1))


@njit(cache=True, inline="always")
def access(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, x: int) -> None:
    bk[x, FREQ] += 1


@njit(cache=True, inline="always")
def insert(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, x: int) -> None:
    bk[x, FREQ] = 1


@njit(cache=True, inline="always")
def cost_per_token(pos: int, ntok: int, block_size: float, attn_scale: float) -> float:
    """Prefill work per token of a block at position POS (1 = linear layers only)."""
    return 1.0 + (pos * block_size + 0.5 * ntok) / attn_scale


@njit(cache=True, inline="always")
def _sift_down(it: np.ndarray, n: int, i: int) -> None:
    """The run at slot I of the N-run heap moves down to its place (by its next entry's key, then stamp)."""
    m = it.shape[0] // 5
    run, key, tie = it[RH_RUN * m + i], it[RH_KEY * m + i], it[RH_TIE * m + i]
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        ck, ct = it[RH_KEY * m + c], it[RH_TIE * m + c]
        if c + 1 < n:
            dk, dt = it[RH_KEY * m + c + 1], it[RH_TIE * m + c + 1]
            if dk < ck or (dk == ck and dt < ct):
                c, ck, ct = c + 1, dk, dt
        if not (ck < key or (ck == key and ct < tie)):
            break
        it[RH_RUN * m + i], it[RH_KEY * m + i], it[RH_TIE * m + i] = it[RH_RUN * m + c], ck, ct
        i = c
    it[RH_RUN * m + i], it[RH_KEY * m + i], it[RH_TIE * m + i] = run, key, tie


@njit(cache=True, inline="always")
def _close_run(hp: np.ndarray, g: np.ndarray, it: np.ndarray) -> None:
    """The run being released (kept in descending order) is reversed and joins the run heap."""
    s = g[PEND]
    if s < 0:
        return
    g[PEND] = -1
    e = g[TAIL]
    a, b = s, e - 1
    while a < b:
        k, t = hp[a, HKEY], hp[a, HTIE]
        hp[a, HKEY], hp[a, HTIE] = hp[b, HKEY], hp[b, HTIE]
        hp[b, HKEY], hp[b, HTIE] = k, t
        a += 1
        b -= 1
    m = it.shape[0] // 5
    it[RUN_END * m + s] = e
    it[RUN_CUR * m + s] = s
    key, tie = hp[s, HKEY], hp[s, HTIE]
    i = g[NRUNS]
    g[NRUNS] += 1
    while i > 0:  # sift up
        p = (i - 1) // 2
        pk, pt = it[RH_KEY * m + p], it[RH_TIE * m + p]
        if not (key < pk or (key == pk and tie < pt)):
            break
        it[RH_RUN * m + i], it[RH_KEY * m + i], it[RH_TIE * m + i] = it[RH_RUN * m + p], pk, pt
        i = p
    it[RH_RUN * m + i], it[RH_KEY * m + i], it[RH_TIE * m + i] = s, key, tie


@njit(cache=True, inline="always")
def _compact(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, it: np.ndarray) -> None:
    """Move the valid entries of every run, and the run being released, to the front of the arena (runs
    in arena order; a run left empty is dropped) and rebuild the run heap."""
    m = it.shape[0] // 5
    n = g[NRUNS]
    starts = np.sort(it[RH_RUN * m:RH_RUN * m + n])
    w = 0
    k = 0
    for j in range(n):
        s = starts[j]
        a, e = it[RUN_CUR * m + s], it[RUN_END * m + s]
        w0 = w
        for i in range(a, e):
            if entry_valid(bk, hp, i):
                hp[w, HKEY], hp[w, HTIE] = hp[i, HKEY], hp[i, HTIE]
                w += 1
        if w > w0:
            it[RUN_END * m + w0] = w
            it[RUN_CUR * m + w0] = w0
            it[RH_RUN * m + k], it[RH_KEY * m + k], it[RH_TIE * m + k] = w0, hp[w0, HKEY], hp[w0, HTIE]
            k += 1
    p = g[PEND]
    if p >= 0:
        g[PEND] = w
        for i in range(p, g[TAIL]):
            hp[w, HKEY], hp[w, HTIE] = hp[i, HKEY], hp[i, HTIE]
            w += 1
    g[TAIL] = w
    g[NRUNS] = k
    for i in range(k // 2 - 1, -1, -1):
        _sift_down(it, k, i)


@njit(cache=True, inline="always")
def release(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray,
            x: int, ref: int, pos: int, ntok: int, c: int, now: float) -> None:
    h = gf[CLOCK] + bk[x, FREQ] * cost_per_token(pos, ntok, fp[FP_BLOCK_SIZE], fp[FP_ATTN_SCALE])
    key = int(h * KEY_SCALE)
    if g[PEND] >= 0:  # a new request, or the entry would go deep into the run: the run is closed
        j = g[TAIL]
        lo = max(g[PEND], j - MAX_SHIFT)
        while j > lo and hp[j - 1, HKEY] <= key:
            j -= 1
        if ref >= g[LAST_REF] or (j == lo and j > g[PEND] and hp[j - 1, HKEY] <= key):
            _close_run(hp, g, it)
    g[LAST_REF] = ref
    if g[TAIL] == hp.shape[0]:
        _compact(bk, hp, g, it)
    g[G_HSTAMP] += 1
    bk[x, HVER] = g[G_HSTAMP]
    tie = (g[G_HSTAMP] << 32) | x
    if g[PEND] < 0:
        g[PEND] = g[TAIL]
    i = g[TAIL]
    g[TAIL] += 1
    while i > g[PEND] and hp[i - 1, HKEY] <= key:  # descending by (key, stamp); this stamp is the largest
        hp[i, HKEY], hp[i, HTIE] = hp[i - 1, HKEY], hp[i - 1, HTIE]
        i -= 1
    hp[i, HKEY] = key
    hp[i, HTIE] = tie


@njit(cache=True, inline="always")
def evict(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
          qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, now: float) -> int:
    """The valid entry with the smallest (key, stamp); the clock becomes its key."""
    _close_run(hp, g, it)
    m = it.shape[0] // 5
    while g[NRUNS] > 0:
        r = it[RH_RUN * m]
        e = it[RUN_CUR * m + r]
        it[RUN_CUR * m + r] = e + 1
        if e + 1 == it[RUN_END * m + r]:  # the run is used up: the last run takes its slot
            g[NRUNS] -= 1
            n = g[NRUNS]
            it[RH_RUN * m], it[RH_KEY * m], it[RH_TIE * m] = it[RH_RUN * m + n], it[RH_KEY * m + n], it[RH_TIE * m + n]
        else:
            it[RH_KEY * m], it[RH_TIE * m] = hp[e + 1, HKEY], hp[e + 1, HTIE]
        _sift_down(it, g[NRUNS], 0)
        if g[NRUNS] > 0:  # the next victim, most likely: start loading its row
            prefetch_row(bk, it[RH_TIE * m] & ID_MASK)  # type: ignore[call-arg]
        if entry_valid(bk, hp, e):
            gf[CLOCK] = float(hp[e, HKEY]) / KEY_SCALE
            return hp[e, HTIE] & ID_MASK
    return -1


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
