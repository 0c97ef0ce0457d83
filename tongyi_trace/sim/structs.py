"""Array-backed data structures shared by the compiled policies: the simulator state, intrusive doubly
linked queues over dense block ids, a lazy 4-ary min-heap, and a cycle counter for eviction timing.

All of it is numba-compiled (cache=True); nothing allocates per reference. The state is a handful of
plain arrays (a tuple of arrays would cost a reference-count update per field access):

    bk  int64[D + NQ, NUM_ROWS]  one row per block, its fields side by side (two cache lines per block,
                                 the array aligned to a line); rows D.. are the queue sentinels.
                                 The kernel's columns (kernel.py):
                                   PRESENT, PINNED  cached; held by the running request
                                   PARK     leaf_only: 0, 1 = chosen by the policy while it had cached
                                            children (held back), 2 = parked and now a leaf (evicted next)
                                   LAST     last access (release time of the last request using it), in us
                                   NCHILD   cached children (blocks whose parent, the previous block of
                                            their request, is this one): 0 = a leaf of the cached forest
                                   PGEN     GEN of the parent when this block was counted in its NCHILD
                                            (0 = not counted); GEN counts this block's insertions
                                 the queues' links QPREV, QNEXT, QID and the heap's HVER (below);
                                 and POLICY_COLUMNS columns from POLICY_COL0 that a policy names and
                                 documents in its own file (policy_base.StateDecl)
    hp  int64[4, Hn]             heap entries by rows KEY1, KEY2 (the key, compared as a pair), HID (the
                                 block) and HENT (its version): one array per field, so the keys of a
                                 node's 4 children share a cache line
    g   int64[G_POLICY + ...]    the kernel's and the heap's scalars (G_SIZE, G_HSIZE), then the policy's
    gf  float64[...]             the policy's float scalars (policy_base.StateDecl)
    qs  int64[NQ]                queue sizes
    rl  int64[2, D + 2]          the kernel's two FIFOs of held-back blocks (kernel.py): next and previous
                                 links, sentinel D (became leaves) and D + 1 (still with children)

Queues: node ids 0..D-1 are blocks, node D+q is the sentinel of queue q. The head of a queue
(`q_head`) is its OLDEST member, the end evicted from; `q_append` adds at the newest end.

Lazy 4-ary min-heap: keys are int64 pairs (policies scale float priorities to integers); a block's newest
entry is its key, older ones are skipped when popped (see the heap's section).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# columns of bk: the kernel's, the queues', the heap's, then the policy's
PRESENT, PINNED, PARK, QPREV, QNEXT, QID, LAST, NCHILD, PGEN, GEN, HVER = range(11)
POLICY_COL0 = 11  # the first column a policy may declare (policy_base.StateDecl)
POLICY_COLUMNS = 5
NUM_ROWS = POLICY_COL0 + POLICY_COLUMNS
# rows of hp
KEY1, KEY2, HID, HENT = range(4)  # HENT: the entry's version (HVER of its block when pushed)
ARITY = 4  # a 4-ary heap: half the depth of a binary one
HOFF = 3  # logical entry i is at column i + HOFF, so the 4 children of a node start on a 32-byte boundary
# indices into g: the kernel's and the heap's scalars, then the policy's (policy_base.StateDecl)
G_SIZE = 0  # cached blocks (the kernel's)
G_HSIZE = 1  # entries in the heap
G_POLICY = 2
LINE_BYTES = 64


def _aligned_zeros(shape: tuple[int, int]) -> np.ndarray:
    """int64 zeros of SHAPE whose first element starts a cache line."""
    n = shape[0] * shape[1]
    per_line = LINE_BYTES // 8
    buf = np.zeros(n + per_line, np.int64)
    off = (-buf.ctypes.data % LINE_BYTES) // 8
    return buf[off:off + n].reshape(shape)


def make_state(num_ids: int, num_queues: int, heap_size: int, g0: np.ndarray, gf0: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(bk, hp, g, gf, qs, rl) for NUM_IDS blocks; G0 and GF0 are the policy's initial scalars (after the
    kernel's in g); rl = the links of the kernel's lists of held-back blocks (sentinels NUM_IDS and
    NUM_IDS + 1)."""
    d = num_ids
    nq = max(num_queues, 1)
    bk = _aligned_zeros((d + nq, NUM_ROWS))
    bk[:, QID] = -1
    for q in range(nq):
        bk[d + q, QPREV] = d + q
        bk[d + q, QNEXT] = d + q
    g = np.concatenate([np.zeros(G_POLICY, np.int64), np.asarray(g0, np.int64)])
    gf = np.array(gf0, np.float64) if len(gf0) else np.zeros(1, np.float64)
    rl = np.full((2, d + 2), d, np.int64)
    rl[:, d + 1] = d + 1
    width = -(-(max(heap_size, 1) + HOFF) // 8) * 8  # rows start on a line too
    hp = _aligned_zeros((4, width))
    return bk, hp, g, gf, np.zeros(nq, np.int64), rl


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
# Lazy 4-ary min-heap: an entry is valid while its version still equals its block's HVER and the block is
# cached and not pinned; a block's version is bumped whenever it is re-pushed, so stale entries are skipped
# on pop. When the heap is full it is compacted to its valid entries (at most the capacity).
@njit(cache=True, inline="always")
def _less(hp: np.ndarray, i: int, j: int) -> bool:
    if hp[KEY1, i] != hp[KEY1, j]:
        return hp[KEY1, i] < hp[KEY1, j]
    return hp[KEY2, i] < hp[KEY2, j]


@njit(cache=True, inline="always")
def _move(hp: np.ndarray, dst: int, src: int) -> None:
    for r in range(4):
        hp[r, dst] = hp[r, src]


@njit(cache=True)
def _sift_up(hp: np.ndarray, i: int) -> None:
    """The entry at column I moves up to its place (columns are logical index + HOFF)."""
    k1, k2, x, v = hp[KEY1, i], hp[KEY2, i], hp[HID, i], hp[HENT, i]
    while i > HOFF:
        p = (i - HOFF - 1) // ARITY + HOFF
        pk1 = hp[KEY1, p]
        if k1 < pk1 or (k1 == pk1 and k2 < hp[KEY2, p]):
            _move(hp, i, p)
            i = p
        else:
            break
    hp[KEY1, i], hp[KEY2, i], hp[HID, i], hp[HENT, i] = k1, k2, x, v


@njit(cache=True)
def _pop_root(hp: np.ndarray, n: int) -> None:
    """Remove the root of the N-entry heap (bottom-up: the hole goes down along the smaller children to a
    leaf, the last entry fills it and moves up)."""
    i = HOFF
    end = n + HOFF
    while True:
        first = ARITY * (i - HOFF) + 1 + HOFF
        if first >= end:
            break
        m = first
        for c in range(first + 1, min(first + ARITY, end)):
            if _less(hp, c, m):
                m = c
        _move(hp, i, m)
        i = m
    last = end - 1
    if i != last:
        _move(hp, i, last)
        _sift_up(hp, i)


@njit(cache=True, inline="always")
def _valid(bk: np.ndarray, hp: np.ndarray, i: int) -> bool:
    x = hp[HID, i]
    return hp[HENT, i] == bk[x, HVER] and bk[x, PRESENT] == 1 and bk[x, PINNED] == 0


@njit(cache=True)
def _compact(bk: np.ndarray, hp: np.ndarray, g: np.ndarray) -> None:
    n = g[G_HSIZE]
    m = 0
    for i in range(HOFF, n + HOFF):
        if _valid(bk, hp, i):
            _move(hp, m + HOFF, i)
            m += 1
    g[G_HSIZE] = m
    for i in range(HOFF + 1, m + HOFF):
        _sift_up(hp, i)


@njit(cache=True)
def heap_push(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, x: int, k1: int, k2: int) -> None:
    """Make (K1, K2) the key of block X (bumps its version: older entries become stale)."""
    if g[G_HSIZE] + HOFF == hp.shape[1]:
        _compact(bk, hp, g)
    bk[x, HVER] += 1
    i = g[G_HSIZE] + HOFF
    g[G_HSIZE] += 1
    hp[KEY1, i], hp[KEY2, i], hp[HID, i], hp[HENT, i] = k1, k2, x, bk[x, HVER]
    _sift_up(hp, i)


@njit(cache=True)
def heap_pop_valid(bk: np.ndarray, hp: np.ndarray, g: np.ndarray) -> tuple[int, int]:
    """Remove the valid block with the smallest key: (block, its key1), or (-1, 0) when there is none."""
    while g[G_HSIZE] > 0:
        ok = _valid(bk, hp, HOFF)
        x = hp[HID, HOFF]
        k1 = hp[KEY1, HOFF]
        _pop_root(hp, g[G_HSIZE])
        g[G_HSIZE] -= 1
        if ok:
            return x, k1
    return -1, 0


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
