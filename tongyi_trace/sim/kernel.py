"""The prefix-cache core: replays requests one at a time through one policy (numba-compiled).

Semantics (vLLM's, vllm/v1/core/kv_cache_manager.py and block_pool.py), per request r in order:
1. hit = the longest prefix of r's block ids that is cached (capped at maxhit[r], vLLM's last-token rule
   when modelling an engine); those blocks are accessed and pinned;
2. each later block: if cached anyway (possible for non-LRU policies: a child kept while its parent
   was evicted) it is accessed and pinned but counts as a miss, an ORPHANED reference when the prefix
   ended at a missing block; otherwise it is inserted, evicting unpinned blocks while the cache is
   full; when only pinned blocks are left the rest of the request is not cached (counted as bypass);
3. the request is served: its blocks are released deepest first (vLLM frees tail-first), so the
   prefix head is the most recent; the kernel stamps each block's last access (LAST) first.
Only the first nstat[r] blocks count in the statistics (the engine model appends never-hit output
blocks after them); extra[r] slots are held by r while it runs and free afterwards (a partial block),
made room for after r's other blocks are in, as vLLM allocates them.

Prefix closure (`leaf_only`): the parent of a block is the previous block of its request (parent[x],
from the stream). The kernel counts each cached block's cached children (structs.nchild, in the block's
FOREST column beside its insertion stamp: a block entering the cache is counted in its parent when the
parent is cached, and uncounted when it leaves if the parent is still the incarnation that counted it,
structs.forest_leave). With leaf_only, a victim the policy chooses while it still has cached children is
held back (PARK = 1: cached, out of the policy's order, in the held list) and the policy is asked again;
when its last cached child goes it is evicted before anything else (PARK = 2, FIFO among such blocks); a
hit on a held-back block hands it back to the policy like any accessed block. Only when the policy has
nothing left to offer is the longest-held block evicted although it has children (an engine must find
room for the running request; vLLM's plugin does the same). So no block is evicted before its
descendants, and no cached block is ever orphaned (a cached child whose prefix cannot hit). LRU is
prefix-closed by itself (a parent is always at least as recent as its children); ORACLE too (a parent's
next use is never later). Such a policy declares PREFIX_CLOSED = True in its module, and the loop
serving one cache (TIER_NONE) takes it at its word: without leaf_only it keeps no count of cached children (a random
parent row per insertion and eviction), so it counts no orphaning eviction, of which there is none (a
property test checks the claim with the count kept). Every count lives in the first cache line of a row,
so a state without a heap or policy columns is narrow whatever it counts (structs.NARROW_ROWS,
simulate.Cache).

Two tiers (TieredCache in simulate.py; docs/fleet.md "Tiers"): the same loop with the run-time switch
TIER (the last argument; TIER_NONE for one cache):
- TIER_UPPER ("tiered") serves the HBM tier. LOW[x] = 1 marks a block of the request that `promote`
  took out of the DRAM tier: it continues the prefix like a cached block (a hit, counted in S_LOW_HITS and
  S_LOW_HIT_TOKENS) and is inserted once the HBM-cached prefix blocks are pinned. Each evicted block is
  written to OUT in eviction order (the blocks to demote), and each release is recorded in LREL[:, x]
  (reference, position, category, time in us).
- TIER_LOWER ("demote") serves the DRAM tier the demoted blocks, one block a request (REQ_OFF = 0, 1,
  ..., BLK = the blocks, nothing hit, nothing counted): each is inserted as the loop inserts (DRAM's policy evicts, its
  victims leave the cache) and released at once as its recorded release in LREL (the policy orders it
  by that reference, position, category and time).
A state per slot (structs.py: the chunked simulator's, sim/chunked.py) has rows per cache slot, not per
block id: the loop reads each block's row through the map IMAP (an id without a slot reads the row of a
queue sentinel, never present nor pinned), gives an inserted block a free slot (its HVER set to 0,
which no push stamp is: a reused slot's old heap entries stay stale, and its new block's pushes carry
newer stamps than any of them) and frees the slot when the evicted block leaves the policy
too (`keeps`, policy_base.py: S3-FIFO keeps the blocks of its ghost); a slot the policy kept is freed by a
sweep of the slots for those it no longer keeps when the free stack runs out (structs.slots_for leaves an
eighth spare, so a sweep frees at least that many). Parents are block ids (PARENT),
read through the map. The hooks see rows only: a policy that needs the id itself reads BID, which the
loop writes on every insertion into a state with that column (WA's last tie-break). Results equal the
state per block's, request for request (tests/sim/test_slots.py).

`promote` takes blocks out of a cache whatever its policy: a policy keeps its cached blocks only in the
queues and the lazy heap of structs.py (a heap entry of a block that is not cached is stale), so
unlinking the block and clearing PRESENT takes it out of any policy's order; it bumps G_EPOCH, so a
policy that keeps what it derives from its queues (WA's tree of queue heads) rebuilds it.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any

import numpy as np
from numba import njit

# The hook names the loop calls; policy_kernel rebinds them per policy (these are LRU's).
from tongyi_trace.sim.hooks import keeps_none as keeps
from tongyi_trace.sim.policies.lru import access, evict, insert, release
from tongyi_trace.sim.policy_base import prefix_closed
from tongyi_trace.sim.structs import (
    BID,
    FOREST,
    G_EPOCH,
    G_FREE,
    G_INSERTIONS,
    G_SIZE,
    HVER,
    LAST,
    PARK,
    PINNED,
    PRESENT,
    forest_leave,
    inserted_at,
    nchild,
    q_unlink,
    read_cycles,
)

# stats vector layout; with timing, one eviction run in TIMED_EVERY is timed (S_EVICT_CYCLES over
# S_TIMED_EVICTIONS evictions): reading the cycle counter around each would cost more than an LRU eviction
# S_LOW_HITS, S_LOW_HIT_TOKENS: of the hits, those of blocks promoted from the lower tier ("tiered" only)
(S_REFS, S_HITS, S_TOKENS, S_HIT_TOKENS, S_EVICTIONS, S_EVICT_CYCLES, S_BYPASS, S_TOUCHED, S_ORPHANED,
 S_PARKED, S_EVICT_AGE_US, S_ORPHANING, S_EVICT_RUNS, S_TIMED_EVICTIONS, S_LOW_HITS, S_LOW_HIT_TOKENS) = range(16)
NUM_STATS = 16
# the loop's TIER argument (module doc): one cache, the upper tier ("tiered"), the lower tier ("demote"). A
# run-time switch, not a compiled copy per tier: one compile per policy (bench/bench_compile.py)
TIER_NONE, TIER_UPPER, TIER_LOWER = 0, 1, 2
PREFIX_CLOSED = False  # the policy's claim (module doc), bound by policy_kernel; used with TIER_NONE only
# rows of LREL: a block's last release in the upper tier
L_REF, L_POS, L_CAT, L_LAST_US = range(4)
TIMED_EVERY = 64


def _run_loop(req_off: np.ndarray, blk: np.ndarray, ntok: np.ndarray, req_cat: np.ndarray,
              req_time: np.ndarray, req_maxhit: np.ndarray, req_nstat: np.ndarray, req_extra: np.ndarray,
              capacity: int, bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
              qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray,
              parent: np.ndarray, rl: np.ndarray, imap: np.ndarray, sl: np.ndarray, leaf_only: bool,
              timing: bool, low: np.ndarray, lrel: np.ndarray, out: np.ndarray,
              tier: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Replay the request stream through the policy whose hooks this copy was compiled with, at CAPACITY
    blocks, on the state arrays made by structs.make_state (the policy's parameters ip, fp and tables ft,
    it, policy_base.Setup: the loop only hands them to the hooks), PARENT[x] = the parent block of x or
    -1, RL the links of the held-back blocks (structs.make_state), IMAP and SL a state per slot's map and
    slots (structs.make_slots; IMAP = int32[0]: a state per block), LEAF_ONLY = prefix closure, see the
    module doc). REQ_OFF may be a slice of the stream's offsets (absolute positions in BLK): the state
    arrays carry the cache from one call to the next. LOW, LREL, OUT: the two tiers' (module doc: int64
    per block id, int64[4, ids], at least the call's evictions), unread with TIER = TIER_NONE.

    Returns (stats[NUM_STATS], per-request hit blocks, per-request hit tokens, per-category
    [refs, hits, tokens, hit_tokens] as a (num_cats, 4) array)."""
    n_req = req_off.shape[0] - 1
    stats = np.zeros(NUM_STATS, np.int64)
    req_hits = np.zeros(n_req, np.int64)
    req_hit_tokens = np.zeros(n_req, np.int64)
    num_cats = 1
    for r in range(n_req):
        num_cats = max(num_cats, req_cat[r] + 1)
    cat_stats = np.zeros((num_cats, 4), np.int64)
    present = bk[:, PRESENT]
    pinned = bk[:, PINNED]
    # blocks held back by leaf_only: two FIFOs as linked lists over the same links, the held blocks that
    # became leaves (sentinel d) and those that still have cached children (sentinel d + 1)
    d = rl.shape[1] - 2  # rows of blocks (or slots)
    slotted = imap.shape[0] != 0  # a state per slot (module doc)
    sid = sl[0]
    wide = bk.shape[1] > BID
    rnext = rl[0]
    rprev = rl[1]
    num_out = 0
    tiered = tier == TIER_UPPER
    demote = tier == TIER_LOWER
    forest = leaf_only or not PREFIX_CLOSED or tier != TIER_NONE  # count cached children (module doc)
    held = leaf_only or rnext[d] != d or rnext[d + 1] != d + 1  # a block may be held back (PARK != 0)
    # the cache's size and the per-eviction counts live in registers (stored into g and stats at the end)
    size = g[G_SIZE]
    insertions = g[G_INSERTIONS]
    num_evictions = 0
    evict_age_us = 0
    num_evict_runs = 0
    for r in range(n_req):
        s = req_off[r]
        n = req_off[r + 1] - s
        now = req_time[r]
        now_us = np.int64(now * 1e6)
        c = req_cat[r]
        nstat = req_nstat[r]
        # 1. longest cached prefix (tiered: a block promoted from the lower tier continues it)
        h = 0
        lim = min(n, req_maxhit[r])
        while True:
            while h < lim:
                x = _row(imap, blk[s + h])
                if present[x] != 1 or pinned[x] == 1:  # pinned: the same id twice in one request, the
                    break  # prefix stops there
                pinned[x] = 1
                if held and bk[x, PARK] != 0:
                    _unpark(bk, rnext, rprev, x)
                access(bk, hp, g, gf, qs, ip, fp, ft, it, x)
                h += 1
            if not tiered or h >= lim or low[blk[s + h]] != 1:
                break
            low[blk[s + h]] = 2  # inserted in step 2, after the cached prefix blocks are pinned; a second
            if h < nstat:  # occurrence in the request stops the prefix
                stats[S_LOW_HITS] += 1
                stats[S_LOW_HIT_TOKENS] += ntok[s + h]
            h += 1
        hits = min(h, nstat)
        hit_tok = 0
        for k in range(hits):
            hit_tok += ntok[s + k]
        missed = h < lim and present[_row(imap, blk[s + h])] == 0  # the prefix ended at a block not cached
        # 2. the rest: touch what is cached, insert what is not (tiered: from the first block); then room
        # for the request's extra slots, which vLLM takes after its other blocks (the prompt's partial block
        # ends its prefill, the decode's comes last), even when the request inserts nothing
        cap = capacity
        full = False
        for k in range(0 if tiered else h, n + 1):
            if k == n:
                if req_extra[r] == 0 or full:
                    break
                cap = capacity - req_extra[r] + 1  # evict until size + extra <= capacity
                x = b = -1
            else:
                b = blk[s + k]
                x = _row(imap, b)
                if present[x] == 1:
                    if pinned[x] == 0:
                        pinned[x] = 1
                        if held and bk[x, PARK] != 0:
                            _unpark(bk, rnext, rprev, x)
                        access(bk, hp, g, gf, qs, ip, fp, ft, it, x)
                        if k < nstat:
                            stats[S_TOUCHED] += 1
                            if missed:
                                stats[S_ORPHANED] += 1
                    continue
                if full:
                    stats[S_BYPASS] += 1
                    continue
            if size >= cap:
                timed = timing and num_evict_runs % TIMED_EVERY == 0
                num_evict_runs += 1
                ev0 = num_evictions
                t0 = read_cycles() if timed else np.uint64(0)  # type: ignore[call-arg]
                while size >= cap:
                    v = rnext[d]  # a held-back block that became a leaf goes first
                    if v < d:
                        _unpark(bk, rnext, rprev, v)
                    else:
                        while True:  # one call site: each hook is inlined once (bench/bench_compile.py)
                            v = evict(bk, hp, g, gf, qs, ip, fp, ft, it, now)
                            if v < 0 or not leaf_only or nchild(bk, v) <= 0:
                                break
                            bk[v, PARK] = 1
                            _append(rnext, rprev, d + 1, v)
                            stats[S_PARKED] += 1
                        if v < 0 and rnext[d + 1] != d + 1:  # only held blocks are left: the longest-held goes
                            v = rnext[d + 1]
                            _unpark(bk, rnext, rprev, v)
                    if v < 0:
                        break
                    present[v] = 0
                    size -= 1
                    num_evictions += 1
                    evict_age_us += now_us - bk[v, LAST]
                    if forest:
                        if nchild(bk, v) > 0:  # its cached children can no longer hit: orphans
                            stats[S_ORPHANING] += 1
                        # uncount v where it was counted: structs.forest_leave written out (a call taking the
                        # parent array cost FIFO a fifth of its speed; the one-array nchild and inserted_at cost
                        # nothing)
                        p = parent[sid[v]] if slotted else parent[v]
                        if p >= 0:
                            p = _row(imap, p)
                        if p >= 0 and present[p] == 1 and inserted_at(bk, p) < inserted_at(bk, v):
                            bk[p, FOREST] -= 1
                            if nchild(bk, p) == 0 and bk[p, PARK] == 1:  # a held-back parent is now a leaf
                                _unlink(rnext, rprev, p)
                                bk[p, PARK] = 2
                                _append(rnext, rprev, d, p)
                    if slotted and not keeps(bk, hp, g, gf, qs, ip, fp, ft, it, v):  # its slot is free
                        imap[sid[v]] = d
                        sid[v] = -1
                        sl[1, g[G_FREE]] = v
                        g[G_FREE] += 1
                    if tiered:
                        out[num_out] = v
                        num_out += 1
                if timed:
                    stats[S_EVICT_CYCLES] += np.int64(read_cycles() - t0)  # type: ignore[call-arg]
                    stats[S_TIMED_EVICTIONS] += num_evictions - ev0
                if size >= cap:
                    full = True
                    stats[S_BYPASS] += x >= 0
                    continue
            if x < 0:
                break
            if x >= d:  # a state per slot, the block has none: it takes a free one (module doc)
                if g[G_FREE] == 0:  # none left: free the slots of the blocks the policy no longer keeps
                    for y in range(d):
                        if sid[y] >= 0 and present[y] == 0 and not keeps(bk, hp, g, gf, qs, ip, fp, ft, it, y):
                            imap[sid[y]] = d
                            sid[y] = -1
                            sl[1, g[G_FREE]] = y
                            g[G_FREE] += 1
                    if g[G_FREE] == 0:
                        raise RuntimeError("the state per slot is full (structs.slots_for sized it too small)")
                g[G_FREE] -= 1
                x = sl[1, g[G_FREE]]
                imap[b] = x
                sid[x] = b
                if wide:
                    bk[x, HVER] = 0
            if wide:
                bk[x, BID] = b
            present[x] = 1
            pinned[x] = 1
            if forest:
                insertions += 1
                bk[x, FOREST] = insertions << 32  # no cached child yet
                p = parent[b]
                if p >= 0:
                    p = _row(imap, p)
                if p >= 0 and present[p] == 1:
                    bk[p, FOREST] += 1
            size += 1
            insert(bk, hp, g, gf, qs, ip, fp, ft, it, x)
        # 3. served: release deepest first (demote: as the block's last release in the upper tier)
        for k in range(n - 1, -1, -1):
            x = _row(imap, blk[s + k])
            if tiered:
                low[x] = 0
            if pinned[x] == 1:
                pinned[x] = 0
                if demote:
                    ref, pos, cat = lrel[L_REF, x], lrel[L_POS, x], lrel[L_CAT, x]
                    bk[x, LAST] = lrel[L_LAST_US, x]
                else:
                    ref, pos, cat = s + k, k, c
                    bk[x, LAST] = now_us
                    if tiered:
                        lrel[L_REF, x] = ref
                        lrel[L_POS, x] = pos
                        lrel[L_CAT, x] = cat
                        lrel[L_LAST_US, x] = now_us
                release(bk, hp, g, gf, qs, ip, fp, ft, it, x, ref, pos, ntok[ref], cat, now)
        tok = 0
        for k in range(nstat):
            tok += ntok[s + k]
        req_hits[r] = hits
        req_hit_tokens[r] = hit_tok
        stats[S_REFS] += nstat
        stats[S_HITS] += hits
        stats[S_TOKENS] += tok
        stats[S_HIT_TOKENS] += hit_tok
        cat_stats[c, 0] += nstat
        cat_stats[c, 1] += hits
        cat_stats[c, 2] += tok
        cat_stats[c, 3] += hit_tok
    g[G_SIZE] = size
    g[G_INSERTIONS] = insertions
    stats[S_EVICTIONS] = num_evictions
    stats[S_EVICT_AGE_US] = evict_age_us
    stats[S_EVICT_RUNS] = num_evict_runs
    return stats, req_hits, req_hit_tokens, cat_stats


@njit(cache=True)
def cached_prefix_len(req_off: np.ndarray, blk: np.ndarray, bk: np.ndarray, lower: np.ndarray, r: int) -> int:
    """How many leading blocks of request R are cached in the state BK or in LOWER (another tier's; BK
    again for one cache), with no side effect."""
    h = 0
    for i in range(req_off[r], req_off[r + 1]):
        x = blk[i]
        if bk[x, PRESENT] != 1 and lower[x, PRESENT] != 1:
            break
        h += 1
    return h


@njit(cache=True)
def promote(req_off: np.ndarray, blk: np.ndarray, r: int, bk: np.ndarray, g: np.ndarray, qs: np.ndarray,
            parent: np.ndarray, rl: np.ndarray, low: np.ndarray) -> int:
    """Take every block of request R that the cache (state BK, G, QS, RL: the lower tier) holds out of it,
    whatever its policy (module doc), and mark it in LOW for the upper tier's loop; return how many. The
    block leaves as an evicted one does in the loop (kept inline there: the same steps as an inlined
    helper taking arrays cost the plain loop up to a third of its speed, numba's reference counting)."""
    rnext = rl[0]
    rprev = rl[1]
    d = rl.shape[1] - 2
    num = 0
    for k in range(req_off[r], req_off[r + 1]):
        v = blk[k]
        if bk[v, PRESENT] != 1:
            continue
        _unpark(bk, rnext, rprev, v)
        q_unlink(bk, qs, v)
        bk[v, PRESENT] = 0
        g[G_SIZE] -= 1
        p = forest_leave(bk, parent, v)
        if p >= 0 and bk[p, PARK] == 1:  # a held-back parent is now a leaf
            _unlink(rnext, rprev, p)
            bk[p, PARK] = 2
            _append(rnext, rprev, d, p)
        low[v] = 1
        num += 1
    if num:
        g[G_EPOCH] += 1  # the policy's queues changed behind its hooks
    return num


@njit(cache=True, inline="always")
def _row(imap: np.ndarray, x: int) -> int:
    """The state's row of block id X: X itself in a state per block (IMAP empty), else its slot."""
    return imap[x] if imap.shape[0] != 0 else x


@njit(cache=True, inline="always")
def _append(rnext: np.ndarray, rprev: np.ndarray, sentinel: int, x: int) -> None:
    last = rprev[sentinel]
    rnext[last] = x
    rprev[x] = last
    rnext[x] = sentinel
    rprev[sentinel] = x


@njit(cache=True, inline="always")
def _unlink(rnext: np.ndarray, rprev: np.ndarray, x: int) -> None:
    p = rprev[x]
    n = rnext[x]
    rnext[p] = n
    rprev[n] = p


@njit(cache=True, inline="always")
def _unpark(bk: np.ndarray, rnext: np.ndarray, rprev: np.ndarray, x: int) -> None:
    """X leaves the held-back state (it is accessed again, or evicted)."""
    if bk[x, PARK] != 0:
        _unlink(rnext, rprev, x)
    bk[x, PARK] = 0


_KERNELS: dict[str, Any] = {}


def policy_kernel(name: str, hooks: ModuleType) -> Any:
    """The compiled replay loop specialised to the policy module HOOKS (its access/insert/release/evict);
    one cache or either tier by its TIER argument (module doc).

    The loop's code is shared (compiled without the GIL, so threads can run sweeps in parallel); each
    policy gets its own function object whose globals bind the hook names to that policy, under its own
    name (so numba's on-disk cache keeps one entry per policy). The name carries a digest of the
    simulator's sources: numba checks only this file's timestamp, so without it an edited policy or
    structs.py would keep running the stale cached machine code. For the same reason every function of a
    policy file is inlined (inline="always") or compiled uncached with the loop (cache=False, wa.py): its
    columns and slots come from policy_base and structs, which a separately cached function would not see
    change. Each hook is called from one place in the loop (numba inlines a callee's IR at every call site:
    bench/bench_compile.py). The stream's arrays reach it read-only
    (sim/stream.py), in this process and in an executor's workers alike, so it compiles once."""
    if name not in _KERNELS:
        env = dict(globals())
        env.update(access=hooks.access, insert=hooks.insert, release=hooks.release, evict=hooks.evict,
                   keeps=getattr(hooks, "keeps", keeps), PREFIX_CLOSED=prefix_closed(hooks))
        fn_name = f"run_{name}_{_sources_digest()}"
        fn = FunctionType(_run_loop.__code__, env, fn_name)
        fn.__qualname__ = fn_name
        fn.__doc__ = _run_loop.__doc__
        _KERNELS[name] = njit(cache=True, nogil=True)(fn)
    return _KERNELS[name]


@lru_cache(maxsize=1)
def _sources_digest() -> str:
    """8 hex digits over the sources compiled into the kernels."""
    here = Path(__file__).parent
    files = [here / "kernel.py", here / "structs.py", here / "policy_base.py", here / "hooks.py",
             *sorted((here / "policies").glob("*.py")), here.parent / "policy" / "wa_priority.py"]
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:8]
