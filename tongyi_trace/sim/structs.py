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
                                   FOREST   the block's place in the cached forest, two numbers in one
                                            int64 (as the heap's stamp and id): its insertion stamp
                                            (`inserted_at`: the cache's count of insertions when it
                                            entered, 1.. < 2^31) and its cached children (`nchild`:
                                            blocks whose parent, the previous block of their request,
                                            is this one; 0 = a leaf), see kernel.py
                                 the queues' links QPREV, QNEXT, QID and the heap's HVER (below);
                                   BID      the id of the block the row holds (a slot's occupant in a state
                                            per slot, below): written by the kernel on each insertion
                                 and POLICY_COLUMNS columns from POLICY_COL0 that a policy names and
                                 documents in its own file (policy_base.StateDecl). A state that needs
                                 no column after FOREST (no heap, no policy column) has NARROW_ROWS
                                 columns: one cache line per block (simulate.Cache decides)
    hp  int64[Hn, 2]             heap entries (HKEY, HTIE), 16 bytes each: a node's 4 children fill one
                                 cache line
    g   int64[G_POLICY + ...]    the kernel's and the heap's scalars (G_SIZE, G_INSERTIONS, G_EPOCH, G_FREE;
                                 G_HSIZE, G_HSTAMP), then the policy's
    gf  float64[...]             the policy's float scalars (policy_base.StateDecl)
    qs  int64[NQ]                queue sizes
    rl  int64[2, D + 2]          the kernel's two FIFOs of held-back blocks (kernel.py): next and previous
                                 links, sentinel D (became leaves) and D + 1 (still with children)

A state per slot (make_slots; the chunked simulator's, sim/chunked.py): D is not the number of distinct
blocks but of SLOTS, rows a block holds while it is cached or its policy keeps it (policy_base.py `keeps`:
S3-FIFO's ghost), so the state is bounded by the capacity, not the trace. Beside it:
    imap  int32[distinct blocks]  the row (slot) of each block id; D (a queue sentinel's row, never
                                  present nor pinned) when it has none
    sl    int64[2, D]             sl[0] = the block id each slot holds (-1: free), sl[1, :g[G_FREE]] the
                                  free slots (a stack)
The kernel gives a block a slot when it is inserted and frees the slot when the block leaves the cache
and its policy (at the eviction, or later in a sweep of the slots when the free stack runs out: a slot
the policy kept is swept once it no longer keeps it), see kernel.py. A state per block passes
imap = int32[0] (no map: the row is the block id).

Queues: node ids 0..D-1 are blocks, node D+q is the sentinel of queue q. The head of a queue
(`q_head`) is its OLDEST member, the end evicted from; `q_append` adds at the newest end.

Lazy 4-ary min-heap: keys are int64 (policies scale float priorities to integers), ties pop in push
order; a block's newest entry is its key, older ones are skipped when popped (see the heap's section).
Stamps and block ids share one int64: at most MAX_HEAP_PUSHES pushes and MAX_HEAP_IDS blocks.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# columns of bk: the kernel's, the queues', the heap's, then the policy's
PRESENT, PINNED, PARK, QPREV, QNEXT, QID, LAST, FOREST, HVER, BID = range(10)
POLICY_COL0 = 10  # the first column a policy may declare (policy_base.StateDecl)
POLICY_COLUMNS = 6
NUM_ROWS = POLICY_COL0 + POLICY_COLUMNS
NARROW_ROWS = FOREST + 1  # the columns of a narrow state (module doc)
MAX_INSERTIONS = (1 << 31) - 1  # insertion stamps (FOREST's high half) of one cache
# columns of hp
HKEY, HTIE = 0, 1  # the key; push stamp << 32 | block id (the tie-break, and the entry's block and version)
ID_MASK = (1 << 32) - 1
MAX_HEAP_IDS = 1 << 32
MAX_HEAP_PUSHES = (1 << 31) - 1
ARITY = 4  # a 4-ary heap: half the depth of a binary one
HOFF = 3  # logical entry i is at row i + HOFF, so the 4 children of a node fill one cache line
# indices into g: the kernel's and the heap's scalars, then the policy's (policy_base.StateDecl)
G_SIZE = 0  # cached blocks (the kernel's)
G_HSIZE = 1  # entries in the heap
G_HSTAMP = 2  # heap pushes so far
G_INSERTIONS = 3  # insertions so far, the last stamp in FOREST (the kernel's, kept while it counts children)
G_EPOCH = 4  # bumped when anything but the policy's hooks changes its queues or parameters (kernel.promote,
#              simulate.Cache.changed): a policy that keeps what it derived from them (WA's tree) rebuilds it
G_FREE = 5  # free slots on the stack sl[1] (a state per slot, module doc)
G_POLICY = 6
LINE_BYTES = 128  # two cache lines: a row of bk is one aligned pair (the adjacent-line prefetcher)


def aligned_zeros(shape: tuple[int, int]) -> np.ndarray:
    """int64 zeros of SHAPE whose first element starts a cache line."""
    n = shape[0] * shape[1]
    per_line = LINE_BYTES // 8
    buf = np.zeros(n + per_line, np.int64)
    off = (-buf.ctypes.data % LINE_BYTES) // 8
    return buf[off:off + n].reshape(shape)


def make_state(num_ids: int, num_queues: int, heap_size: int, g0: np.ndarray, gf0: np.ndarray,
               num_columns: int = NUM_ROWS,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(bk, hp, g, gf, qs, rl) for NUM_IDS blocks; G0 and GF0 are the policy's initial scalars (after the
    kernel's in g); rl = the links of the kernel's lists of held-back blocks (sentinels NUM_IDS and
    NUM_IDS + 1). NUM_COLUMNS: NUM_ROWS, or NARROW_ROWS for a narrow state (module doc)."""
    if num_columns not in (NUM_ROWS, NARROW_ROWS):
        raise ValueError(f"a state has {NUM_ROWS} or {NARROW_ROWS} columns, not {num_columns}")
    d = num_ids
    nq = max(num_queues, 1)
    bk = aligned_zeros((d + nq, num_columns))
    bk[:, QID] = -1
    for q in range(nq):
        bk[d + q, QPREV] = d + q
        bk[d + q, QNEXT] = d + q
    g = np.concatenate([np.zeros(G_POLICY, np.int64), np.asarray(g0, np.int64)])
    gf = np.array(gf0, np.float64) if len(gf0) else np.zeros(1, np.float64)
    rl = np.full((2, d + 2), d, np.int64)
    rl[:, d + 1] = d + 1
    hp = aligned_zeros((max(heap_size, 1) + HOFF, 2))
    return bk, hp, g, gf, np.zeros(nq, np.int64), rl


def slots_for(capacity_blocks: int, num_retained: int, num_ids: int) -> int:
    """Slots of a state per slot (module doc) for a cache of CAPACITY_BLOCKS whose policy keeps up to
    NUM_RETAINED evicted blocks in its queues: every cached block's and retained block's, an eighth more
    (so a sweep of the slots frees at least that many, kernel.py) and never more than NUM_IDS."""
    held = capacity_blocks + num_retained + 1
    return min(num_ids, held + max(64, held // 8))


def make_slots(num_ids: int, num_slots: int, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(imap, sl) of a state per slot (module doc) for NUM_IDS block ids and NUM_SLOTS slots, all free
    (G_FREE of the state's scalars G set to NUM_SLOTS)."""
    if num_slots >= (1 << 31) - 1:
        raise ValueError(f"a state per slot holds fewer than 2^31 - 1 slots, not {num_slots:,}")
    imap = np.full(max(num_ids, 1), num_slots, np.int32)
    sl = np.empty((2, num_slots), np.int64)
    sl[0] = -1
    sl[1] = np.arange(num_slots - 1, -1, -1)  # popped from the end: slot 0 first
    g[G_FREE] = num_slots
    return imap, sl


# ---------------------------------------------------------------- the cached forest (FOREST)
@njit(cache=True, inline="always")
def nchild(bk: np.ndarray, x: int) -> int:
    """Cached children of X (FOREST's low half)."""
    return bk[x, FOREST] & ID_MASK


@njit(cache=True, inline="always")
def inserted_at(bk: np.ndarray, x: int) -> int:
    """X's insertion stamp (FOREST's high half; 0 = entered while the kernel counted no children)."""
    return bk[x, FOREST] >> 32


@njit(cache=True, inline="always")
def forest_leave(bk: np.ndarray, parent: np.ndarray, v: int) -> int:
    """V leaves the cache: uncount it from its parent's children when it was counted there, i.e. when the
    parent is cached and entered before V (cached ever since, so it was cached when V entered, which is
    when a child is counted). Returns that parent when it became a leaf, else -1. A stamp rather than a
    flag: a parent evicted and cached again after V entered is another incarnation that never counted V."""
    p = parent[v]
    if p >= 0 and bk[p, PRESENT] == 1 and inserted_at(bk, p) < inserted_at(bk, v):
        bk[p, FOREST] -= 1
        if nchild(bk, p) == 0:
            return p
    return -1


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
# An entry is (KEY, TIE = push stamp << 32 | block): compared as a pair, so equal keys pop in push order.
# It is valid while its stamp is still its block's HVER (the stamp of the block's newest push) and the
# block is cached and not pinned; stale entries are skipped on pop. When the heap is full it is compacted
# to its valid entries (at most the capacity).
@njit(cache=True, inline="always")
def _move(hp: np.ndarray, dst: int, src: int) -> None:
    hp[dst, HKEY] = hp[src, HKEY]
    hp[dst, HTIE] = hp[src, HTIE]


@njit(cache=True)
def _sift_up(hp: np.ndarray, i: int) -> None:
    """The entry at row I moves up to its place (rows are logical index + HOFF)."""
    key, tie = hp[i, HKEY], hp[i, HTIE]
    while i > HOFF:
        p = (i - HOFF - 1) // ARITY + HOFF
        pk = hp[p, HKEY]
        if key < pk or (key == pk and tie < hp[p, HTIE]):
            _move(hp, i, p)
            i = p
        else:
            break
    hp[i, HKEY] = key
    hp[i, HTIE] = tie


@intrinsic
def prefetch_row(typingctx, a, row):
    """Start loading row ROW of the C-contiguous 2-D array A into the cache (llvm.prefetch), so that a
    read of it later does not wait for memory."""
    sig = types.void(a, row)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        r = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = builder.gep(ary.data, [builder.mul(r, cgutils.unpack_tuple(builder, ary.shape, 2)[1])])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, inline="always")
def _min_entry(hp: np.ndarray, c: int, m: int, mk: int, mt: int) -> tuple[int, int, int]:
    """(row, key, tie) of the smaller of entry C and (M, MK, MT), by selects rather than branches."""
    ck = hp[c, HKEY]
    ct = hp[c, HTIE]
    lt = (ck < mk) | ((ck == mk) & (ct < mt))
    return (c if lt else m), (ck if lt else mk), (ct if lt else mt)


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
        nxt = ARITY * (first - HOFF) + 1 + HOFF  # the children's children: start loading them
        for c in range(ARITY):
            if nxt + ARITY * c < end:
                prefetch_row(hp, nxt + ARITY * c)  # type: ignore[call-arg]
        m, mk, mt = first, hp[first, HKEY], hp[first, HTIE]
        if first + ARITY <= end:  # all children present: a fixed count, compiled without branches
            for c in range(first + 1, first + ARITY):
                m, mk, mt = _min_entry(hp, c, m, mk, mt)
        else:
            for c in range(first + 1, end):
                m, mk, mt = _min_entry(hp, c, m, mk, mt)
        hp[i, HKEY] = mk
        hp[i, HTIE] = mt
        i = m
    last = end - 1
    if i != last:
        _move(hp, i, last)
        _sift_up(hp, i)


@njit(cache=True, inline="always")
def entry_valid(bk: np.ndarray, hp: np.ndarray, i: int) -> bool:
    """Entry I of HP is its block's newest (its stamp is the block's HVER) and the block is cached and not
    pinned: the lazy heap's rule (GDSF's run heap keeps its entries by the same rule)."""
    x = hp[i, HTIE] & ID_MASK
    return hp[i, HTIE] >> 32 == bk[x, HVER] and bk[x, PRESENT] == 1 and bk[x, PINNED] == 0


@njit(cache=True)
def _compact(bk: np.ndarray, hp: np.ndarray, g: np.ndarray) -> None:
    n = g[G_HSIZE]
    m = 0
    for i in range(HOFF, n + HOFF):
        if entry_valid(bk, hp, i):
            _move(hp, m + HOFF, i)
            m += 1
    g[G_HSIZE] = m
    for i in range(HOFF + 1, m + HOFF):
        _sift_up(hp, i)


@njit(cache=True)
def heap_push(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, x: int, key: int) -> None:
    """Make KEY the key of block X (its older entries become stale; equal keys pop in push order)."""
    if g[G_HSIZE] + HOFF == hp.shape[0]:
        _compact(bk, hp, g)
    g[G_HSTAMP] += 1
    bk[x, HVER] = g[G_HSTAMP]
    i = g[G_HSIZE] + HOFF
    g[G_HSIZE] += 1
    hp[i, HKEY] = key
    hp[i, HTIE] = (g[G_HSTAMP] << 32) | x
    _sift_up(hp, i)


@njit(cache=True)
def heap_pop_valid(bk: np.ndarray, hp: np.ndarray, g: np.ndarray) -> tuple[int, int]:
    """Remove the valid block with the smallest key: (block, its key), or (-1, 0) when there is none."""
    while g[G_HSIZE] > 0:
        ok = entry_valid(bk, hp, HOFF)
        x = hp[HOFF, HTIE] & ID_MASK
        key = hp[HOFF, HKEY]
        _pop_root(hp, g[G_HSIZE])
        g[G_HSIZE] -= 1
        if ok:
            return x, key
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
