"""Array-backed data structures shared by the compiled policies: the simulator state, intrusive doubly
linked queues over dense block ids, a lazy binary min-heap, and a cycle counter for eviction timing.

All of it is numba-compiled (cache=True); nothing allocates per reference. The state is a handful of
plain arrays (a tuple of arrays would cost a reference-count update per field access):

    bk  int64[NUM_ROWS, D + NQ]  per-block rows (PRESENT, PINNED, QPREV, QNEXT, QID, FREQ, VER, CAT,
                                BPOS, AUX, AUX2); columns D.. are the queue sentinels
    ft  float64[D or 1]          per-block time of the last access (WA)
    hp  int64[3, Hn], hk float64[Hn]   heap entries: (hk key1, hp[K2] key2, hp[HID] block, hp[HVER] version)
    g  int64[8], gf float64[4]  scalars (G_*, GF_*)
    qs int64[NQ]                queue sizes

Queues: node ids 0..D-1 are blocks, node D+q is the sentinel of queue q. The head of a queue
(`q_head`) is its OLDEST member, the end evicted from; `q_append` adds at the newest end.

Lazy heap: an entry is valid while bk[VER, id] still equals its version and the block is cached and
not pinned; a block's version is bumped whenever it is re-pushed, so stale entries are skipped on pop.
When the heap is full it is compacted to its valid entries (at most the capacity).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# rows of bk
PRESENT, PINNED, QPREV, QNEXT, QID, FREQ, VER, CAT, BPOS, AUX, AUX2 = range(11)
NUM_ROWS = 11
# rows of hp
K2, HID, HVER = range(3)
# indices into g (int64 scalars)
G_HSIZE = 0  # entries in the heap
G_STAMP = 1  # monotone counter for tie-breaks
G_SIZE = 2  # cached blocks
G_GHOST = 3  # S3-FIFO: ghost insertions so far
G_CURSOR = 4  # FIFO: walk cursor inside one request (-1 = from the head)
G_NUM_IDS = 5  # D (first sentinel column)
# indices into gf (float64 scalars)
GF_CLOCK = 0  # GDSF inflation value L
GF_LAST_KEY = 1  # key1 of the last popped heap entry


def make_state(num_ids: int, num_queues: int, heap_size: int, per_block: bool
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(bk, ft, hp, hk, g, gf, qs) for NUM_IDS blocks."""
    d = num_ids
    nq = max(num_queues, 1)
    big = np.zeros((NUM_ROWS, d + nq), np.int64)
    big[QID, :] = -1
    for q in range(nq):
        big[QPREV, d + q] = d + q
        big[QNEXT, d + q] = d + q
    hn = max(heap_size, 1)
    g = np.zeros(8, np.int64)
    g[G_CURSOR] = -1
    g[G_NUM_IDS] = d
    return (big, np.zeros(d if per_block else 1, np.float64), np.zeros((3, hn), np.int64),
            np.zeros(hn, np.float64), g, np.zeros(4, np.float64), np.zeros(nq, np.int64))


# ---------------------------------------------------------------- queues
@njit(cache=True, inline="always")
def q_append(bk: np.ndarray, qs: np.ndarray, q: int, x: int) -> None:
    """Add block X at the newest end of queue Q."""
    s = bk.shape[1] - qs.shape[0] + q
    last = bk[QPREV, s]
    bk[QNEXT, last] = x
    bk[QPREV, x] = last
    bk[QNEXT, x] = s
    bk[QPREV, s] = x
    bk[QID, x] = q
    qs[q] += 1


@njit(cache=True, inline="always")
def q_unlink(bk: np.ndarray, qs: np.ndarray, x: int) -> None:
    """Remove block X from its queue (no-op when in none)."""
    q = bk[QID, x]
    if q < 0:
        return
    p = bk[QPREV, x]
    n = bk[QNEXT, x]
    bk[QNEXT, p] = n
    bk[QPREV, n] = p
    bk[QID, x] = -1
    qs[q] -= 1


@njit(cache=True, inline="always")
def q_head(bk: np.ndarray, qs: np.ndarray, q: int) -> int:
    """Oldest block of queue Q, or -1 when empty."""
    d = bk.shape[1] - qs.shape[0]
    x = bk[QNEXT, d + q]
    return -1 if x >= d else x


@njit(cache=True, inline="always")
def q_next(bk: np.ndarray, qs: np.ndarray, x: int) -> int:
    """Block after X towards the newest end, or -1 at the end."""
    n = bk[QNEXT, x]
    return -1 if n >= bk.shape[1] - qs.shape[0] else n


# ---------------------------------------------------------------- lazy heap
@njit(cache=True, inline="always")
def _less(hp: np.ndarray, hk: np.ndarray, i: int, j: int) -> bool:
    if hk[i] != hk[j]:
        return hk[i] < hk[j]
    return hp[K2, i] < hp[K2, j]


@njit(cache=True, inline="always")
def _swap(hp: np.ndarray, hk: np.ndarray, i: int, j: int) -> None:
    a = hk[i]
    hk[i] = hk[j]
    hk[j] = a
    for row in range(3):
        b = hp[row, i]
        hp[row, i] = hp[row, j]
        hp[row, j] = b


@njit(cache=True)
def _sift_down(hp: np.ndarray, hk: np.ndarray, i: int, n: int) -> None:
    while True:
        lo = i
        left = 2 * i + 1
        if left < n and _less(hp, hk, left, lo):
            lo = left
        if left + 1 < n and _less(hp, hk, left + 1, lo):
            lo = left + 1
        if lo == i:
            return
        _swap(hp, hk, i, lo)
        i = lo


@njit(cache=True, inline="always")
def _valid(bk: np.ndarray, hp: np.ndarray, i: int) -> bool:
    x = hp[HID, i]
    return hp[HVER, i] == bk[VER, x] and bk[PRESENT, x] == 1 and bk[PINNED, x] == 0


@njit(cache=True)
def _compact(bk: np.ndarray, hp: np.ndarray, hk: np.ndarray, g: np.ndarray) -> None:
    n = g[G_HSIZE]
    m = 0
    for i in range(n):
        if _valid(bk, hp, i):
            hk[m] = hk[i]
            for row in range(3):
                hp[row, m] = hp[row, i]
            m += 1
    g[G_HSIZE] = m
    for i in range(m // 2 - 1, -1, -1):
        _sift_down(hp, hk, i, m)


@njit(cache=True)
def heap_push(bk: np.ndarray, hp: np.ndarray, hk: np.ndarray, g: np.ndarray, x: int, k1: float,
              k2: int) -> None:
    """Make (K1, K2) the key of block X (bumps its version: older entries become stale)."""
    if g[G_HSIZE] == hk.shape[0]:
        _compact(bk, hp, hk, g)
    bk[VER, x] += 1
    i = g[G_HSIZE]
    g[G_HSIZE] = i + 1
    hk[i] = k1
    hp[K2, i] = k2
    hp[HID, i] = x
    hp[HVER, i] = bk[VER, x]
    while i > 0:
        p = (i - 1) // 2
        if _less(hp, hk, i, p):
            _swap(hp, hk, i, p)
            i = p
        else:
            break


@njit(cache=True)
def heap_pop_valid(bk: np.ndarray, hp: np.ndarray, hk: np.ndarray, g: np.ndarray, gf: np.ndarray
                   ) -> int:
    """Remove and return the valid block with the smallest key (key1 -> gf[GF_LAST_KEY]), or -1."""
    while g[G_HSIZE] > 0:
        n = g[G_HSIZE] - 1
        ok = _valid(bk, hp, 0)
        x = hp[HID, 0]
        k1 = hk[0]
        _swap(hp, hk, 0, n)
        g[G_HSIZE] = n
        _sift_down(hp, hk, 0, n)
        if ok:
            gf[GF_LAST_KEY] = k1
            return x
    return -1


# ---------------------------------------------------------------- cycle counter
@intrinsic
def read_cycles(typingctx):  # type: ignore[no-untyped-def]
    """The CPU cycle counter (llvm.readcyclecounter), for eviction timing inside compiled code."""
    sig = types.uint64()

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        fnty = ir.FunctionType(ir.IntType(64), [])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.readcyclecounter")
        return builder.call(fn, [])

    return sig, codegen


@njit(cache=True)
def cycles_now() -> int:
    """read_cycles() callable from Python (for calibrating cycles to seconds)."""
    return np.int64(read_cycles())
