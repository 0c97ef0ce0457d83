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
from tongyi_trace.sim.structs import (
    G_HSTAMP,
    HKEY,
    HOFF,
    HTIE,
    HVER,
    ID_MASK,
    aligned_zeros,
    entry_valid,
    prefetch_row,
)

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
# valid entries are moved to its front (run by run). The int table `it` is the run heap: heap slot i is
# SLOT values at it[SLOT * (i + 1):], the key and tie of the run's next entry, that entry's arena row and
# the run's end (so that sifting reads only the run heap, a slot's children share one cache line, and a
# run needs no other table).
R_KEY, R_TIE, R_CUR, R_END = range(4)  # the fields of a slot
SLOT = 4
MAX_SHIFT = 16


def init(params: GdsfParams, ctx: InitContext) -> Setup:
    """The arena (the cached blocks, two longest requests, as many stale entries between compactions: the
    lazy heap's size) and the run heap (a slot per arena row at most); block_size_tokens 0 becomes the
    stream's block size."""
    ip, fp = params.to_arrays()
    if fp[FP_BLOCK_SIZE] <= 0:
        fp[FP_BLOCK_SIZE] = float(ctx.stream.block_size)
    size = ctx.lazy_heap_entries
    return Setup(ip, fp, it=aligned_zeros((size + HOFF + 1, SLOT)).reshape(-1), heap_size=size,
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
def _put(it: np.ndarray, i: int, key: int, tie: int, cur: int, end: int) -> None:
    """Slot I of the run heap holds (KEY, TIE, CUR, END)."""
    o = SLOT * (i + 1)
    it[o + R_KEY], it[o + R_TIE], it[o + R_CUR], it[o + R_END] = key, tie, cur, end


@njit(cache=True, inline="always")
def _move(it: np.ndarray, dst: int, src: int) -> None:
    """Slot DST of the run heap takes the run of slot SRC."""
    d, o = SLOT * (dst + 1), SLOT * (src + 1)
    for f in range(SLOT):
        it[d + f] = it[o + f]


@njit(cache=True, inline="always")
def _before(key: int, tie: int, key2: int, tie2: int) -> bool:
    """The entry (KEY, TIE) leaves before (KEY2, TIE2)."""
    return key < key2 or (key == key2 and tie < tie2)


@njit(cache=True, inline="always")
def _sift_down(it: np.ndarray, n: int, i: int, key: int, tie: int, cur: int, end: int) -> None:
    """The run (KEY, TIE, CUR, END) takes slot I of the N-run heap and moves down to its place."""
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        o = SLOT * (c + 1)
        ck, ct = it[o + R_KEY], it[o + R_TIE]
        if c + 1 < n and _before(it[o + SLOT + R_KEY], it[o + SLOT + R_TIE], ck, ct):
            c, ck, ct = c + 1, it[o + SLOT + R_KEY], it[o + SLOT + R_TIE]
        if not _before(ck, ct, key, tie):
            break
        _move(it, i, c)
        i = c
    _put(it, i, key, tie, cur, end)


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
    key, tie = hp[s, HKEY], hp[s, HTIE]
    i = g[NRUNS]
    g[NRUNS] += 1
    while i > 0:  # sift up
        p = (i - 1) // 2
        if not _before(key, tie, it[SLOT * (p + 1) + R_KEY], it[SLOT * (p + 1) + R_TIE]):
            break
        _move(it, i, p)
        i = p
    _put(it, i, key, tie, s, e)


@njit(cache=True, inline="always")
def _compact(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, it: np.ndarray) -> None:
    """Move the valid entries of every run, and the run being released, to the front of the arena (runs
    in arena order; a run left empty is dropped) and rebuild the run heap."""
    n = g[NRUNS]
    runs = it[SLOT:SLOT * (n + 1)].reshape(n, SLOT)
    runs = runs[np.argsort(runs[:, R_CUR])]  # a copy, in arena order
    w = 0
    k = 0
    for j in range(n):
        w0 = w
        for i in range(runs[j, R_CUR], runs[j, R_END]):
            if entry_valid(bk, hp, i):
                hp[w, HKEY], hp[w, HTIE] = hp[i, HKEY], hp[i, HTIE]
                w += 1
        if w > w0:
            _put(it, k, hp[w0, HKEY], hp[w0, HTIE], w0, w)
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
        o = SLOT * (i + 1)
        _sift_down(it, k, i, it[o + R_KEY], it[o + R_TIE], it[o + R_CUR], it[o + R_END])


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
    while g[NRUNS] > 0:
        e = it[SLOT + R_CUR]
        end = it[SLOT + R_END]
        if e + 1 == end:  # the run is used up: the last run takes its slot
            g[NRUNS] -= 1
            o = SLOT * (g[NRUNS] + 1)
            key, tie, cur, last = it[o + R_KEY], it[o + R_TIE], it[o + R_CUR], it[o + R_END]
        else:
            key, tie, cur, last = hp[e + 1, HKEY], hp[e + 1, HTIE], e + 1, end
        _sift_down(it, g[NRUNS], 0, key, tie, cur, last)  # one call site: inlined once
        if g[NRUNS] > 0:  # the next victim, most likely: start loading its row and its run's next entry
            prefetch_row(bk, it[SLOT + R_TIE] & ID_MASK)  # type: ignore[call-arg]
            prefetch_row(hp, it[SLOT + R_CUR] + 1)
        if entry_valid(bk, hp, e):
            gf[CLOCK] = float(hp[e, HKEY]) / KEY_SCALE
            return hp[e, HTIE] & ID_MASK
    return -1


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
