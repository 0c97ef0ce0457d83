"""Array-backed data structures shared by the compiled policies: the simulator state, intrusive doubly
linked queues over dense block ids, a lazy binary min-heap, and a cycle counter for eviction timing.

All of it is numba-compiled (cache=True); nothing allocates per reference. The state is a handful of
plain arrays (a tuple of arrays would cost a reference-count update per field access):

    bk  int64[D + NQ, NUM_ROWS]  one row per block, its fields side by side (two cache lines per block);
                                 rows D.. are the queue sentinels. The kernel's columns:
                                   PRESENT, PINNED  cached; held by the running request
                                   LAST     last access (release time of the last request using it), in us
                                   NCHILD   cached children (blocks whose parent, the previous block of
                                            their request, is this one): 0 = a leaf of the cached forest
                                   PGEN     GEN of the parent when this block was counted in its NCHILD
                                            (0 = not counted); GEN counts this block's insertions
                                   PARK     leaf_only: 0, 1 = chosen by the policy while it had cached
                                            children (held back), 2 = parked and now a leaf (evicted next)
                                 the queue links QPREV, QNEXT, QID (structs' queues, shared by policies);
                                 and the policies' own columns:
                                   FREQ     LFU, GDSF, S3-FIFO: reference count
                                   VER      heap entry version (lazy heap, GDSF and ORACLE)
                                   CAT      WA: category of the last releasing request
                                   BPOS     WA: block position (offset) in that request
                                   AUX      S3-FIFO: ghost stamp when evicted from the small FIFO;
                                            WA: release stamp (the order of its LRU switch)
                                   AUX2     S3-FIFO: destination queue (small or main)
    hp  int64[Hn, 4]             heap entries (KEY1, KEY2, HID block, HVER version), one entry a row
    g   int64[8 + 2 NQ], gf float64[4 + NQ]   scalars (G_*, GF_*) and per-queue caches (WA)
    qs  int64[NQ]                queue sizes
    rl  int64[2, D + 2]          the kernel's two FIFOs of held-back blocks (kernel.py): next and previous
                                 links, sentinel D (became leaves) and D + 1 (still with children)

Queues: node ids 0..D-1 are blocks, node D+q is the sentinel of queue q. The head of a queue
(`q_head`) is its OLDEST member, the end evicted from; `q_append` adds at the newest end.

Lazy 4-ary min-heap: keys are int64 pairs (policies scale float priorities to integers). An entry is valid while
bk[id, VER] still equals its version and the block is cached and not pinned; a block's version is bumped
whenever it is re-pushed, so stale entries are skipped on pop. When the heap is full it is compacted to
its valid entries (at most the capacity).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# columns of bk
PRESENT, PINNED, QPREV, QNEXT, QID, FREQ, VER, CAT, BPOS, AUX, AUX2, LAST, NCHILD, PGEN, GEN, PARK = range(16)
NUM_ROWS = 16
# columns of hp
KEY1, KEY2, HID, HVER = range(4)
ARITY = 4  # a 4-ary heap: half the depth of a binary one, a node's children in two cache lines
# indices into g (int64 scalars); g[G_QCACHE + q] is a per-queue cache
G_HSIZE = 0  # entries in the heap
G_STAMP = 1  # monotone counter for tie-breaks
G_SIZE = 2  # cached blocks
G_GHOST = 3  # S3-FIFO: ghost insertions so far
G_CURSOR = 4  # FIFO: walk cursor inside one request (-1 = from the head)
G_MINF = 5  # LFU: no non-empty bucket below this count
G_QCACHE = 8
# indices into gf (float64 scalars); gf[GF_QCACHE + q] is a per-queue cache
GF_CLOCK = 0  # GDSF inflation value L
GF_LAST_KEY = 1  # key1 of the last popped heap entry
GF_NOW = 2  # WA: the time the per-queue caches were computed for
GF_QCACHE = 4


def make_state(num_ids: int, num_queues: int, heap_size: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(bk, hp, g, gf, qs, rl) for NUM_IDS blocks; rl = the links of the kernel's lists of held-back
    blocks (sentinels NUM_IDS and NUM_IDS + 1)."""
    d = num_ids
    nq = max(num_queues, 1)
    bk = np.zeros((d + nq, NUM_ROWS), np.int64)
    bk[:, QID] = -1
    for q in range(nq):
        bk[d + q, QPREV] = d + q
        bk[d + q, QNEXT] = d + q
    g = np.zeros(G_QCACHE + 2 * nq, np.int64)
    g[G_CURSOR] = -1
    g[G_QCACHE:] = -1
    gf = np.zeros(GF_QCACHE + nq, np.float64)
    gf[GF_NOW] = np.nan
    rl = np.full((2, d + 2), d, np.int64)
    rl[:, d + 1] = d + 1
    return bk, np.zeros((max(heap_size, 1), 4), np.int64), g, gf, np.zeros(nq, np.int64), rl


# ---------------------------------------------------------------- queues
@njit(cache=True, inline="always")
def q_append(bk: np.ndarray, qs: np.ndarray, q: int, x: int) -> None:
    """Add block X at the newest end of queue Q."""
    s = bk.shape[0] - qs.shape[0] + q
    last = bk[s, QPREV]
    bk[last, QNEXT] = x
    bk[x, QPREV] = last
    bk[x, QNEXT] = s
    bk[s, QPREV] = x
    bk[x, QID] = q
    qs[q] += 1


@njit(cache=True, inline="always")
def q_unlink(bk: np.ndarray, qs: np.ndarray, x: int) -> None:
    """Remove block X from its queue (no-op when in none)."""
    q = bk[x, QID]
    if q < 0:
        return
    p = bk[x, QPREV]
    n = bk[x, QNEXT]
    bk[p, QNEXT] = n
    bk[n, QPREV] = p
    bk[x, QID] = -1
    qs[q] -= 1


@njit(cache=True, inline="always")
def q_head(bk: np.ndarray, qs: np.ndarray, q: int) -> int:
    """Oldest block of queue Q, or -1 when empty."""
    d = bk.shape[0] - qs.shape[0]
    x = bk[d + q, QNEXT]
    return -1 if x >= d else x


@njit(cache=True, inline="always")
def q_next(bk: np.ndarray, qs: np.ndarray, x: int) -> int:
    """Block after X towards the newest end, or -1 at the end."""
    n = bk[x, QNEXT]
    return -1 if n >= bk.shape[0] - qs.shape[0] else n


# ---------------------------------------------------------------- lazy heap
@njit(cache=True, inline="always")
def _less(hp: np.ndarray, i: int, j: int) -> bool:
    if hp[i, KEY1] != hp[j, KEY1]:
        return hp[i, KEY1] < hp[j, KEY1]
    return hp[i, KEY2] < hp[j, KEY2]


@njit(cache=True, inline="always")
def _swap(hp: np.ndarray, i: int, j: int) -> None:
    for c in range(4):
        a = hp[i, c]
        hp[i, c] = hp[j, c]
        hp[j, c] = a


@njit(cache=True)
def _sift_down(hp: np.ndarray, i: int, n: int) -> None:
    while True:
        lo = i
        first = ARITY * i + 1
        for c in range(first, min(first + ARITY, n)):
            if _less(hp, c, lo):
                lo = c
        if lo == i:
            return
        _swap(hp, i, lo)
        i = lo


@njit(cache=True, inline="always")
def _valid(bk: np.ndarray, hp: np.ndarray, i: int) -> bool:
    x = hp[i, HID]
    return hp[i, HVER] == bk[x, VER] and bk[x, PRESENT] == 1 and bk[x, PINNED] == 0


@njit(cache=True)
def _compact(bk: np.ndarray, hp: np.ndarray, g: np.ndarray) -> None:
    n = g[G_HSIZE]
    m = 0
    for i in range(n):
        if _valid(bk, hp, i):
            for c in range(4):
                hp[m, c] = hp[i, c]
            m += 1
    g[G_HSIZE] = m
    for i in range((m - 2) // ARITY, -1, -1):
        _sift_down(hp, i, m)


@njit(cache=True)
def heap_push(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, x: int, k1: int, k2: int) -> None:
    """Make (K1, K2) the key of block X (bumps its version: older entries become stale)."""
    if g[G_HSIZE] == hp.shape[0]:
        _compact(bk, hp, g)
    bk[x, VER] += 1
    i = g[G_HSIZE]
    g[G_HSIZE] = i + 1
    hp[i, KEY1] = k1
    hp[i, KEY2] = k2
    hp[i, HID] = x
    hp[i, HVER] = bk[x, VER]
    while i > 0:
        p = (i - 1) // ARITY
        if _less(hp, i, p):
            _swap(hp, i, p)
            i = p
        else:
            break


@njit(cache=True)
def heap_pop_valid(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray) -> int:
    """Remove and return the valid block with the smallest key (its key1 -> gf[GF_LAST_KEY]), or -1."""
    while g[G_HSIZE] > 0:
        n = g[G_HSIZE] - 1
        ok = _valid(bk, hp, 0)
        x = hp[0, HID]
        k1 = hp[0, KEY1]
        _swap(hp, 0, n)
        g[G_HSIZE] = n
        _sift_down(hp, 0, n)
        if ok:
            gf[GF_LAST_KEY] = float(k1)
            return x
    return -1


# ---------------------------------------------------------------- cycle counter
@intrinsic
def read_cycles(typingctx):
    """The CPU cycle counter (llvm.readcyclecounter), for eviction timing inside compiled code."""
    sig = types.uint64()

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.readcyclecounter")
        return builder.call(fn, [])

    return sig, codegen


@njit(cache=True)
def cycles_now() -> int:
    """read_cycles() callable from Python (for calibrating cycles to seconds)."""
    return int(read_cycles())  # type: ignore[call-arg]
