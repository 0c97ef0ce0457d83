"""The prefix-cache core: replays requests one at a time through one policy (numba-compiled).

Semantics (vLLM's, vllm/v1/core/kv_cache_manager.py and block_pool.py), per request r in order:
1. hit = the longest prefix of r's block ids that is cached (capped at maxhit[r], vLLM's last-token rule
   when modelling an engine); those blocks are accessed and pinned;
2. each later block: if cached anyway (possible for non-LRU policies: a child kept while its parent
   was evicted) it is accessed and pinned but counts as a miss; otherwise it is inserted, evicting
   unpinned blocks while the cache is full; when only pinned blocks are left the rest of the request
   is not cached (counted as bypass);
3. the request is served: its blocks are released deepest first (vLLM frees tail-first), so the
   prefix head is the most recent.
Only the first nstat[r] blocks count in the statistics (the engine model appends never-hit output
blocks after them); extra[r] slots are held by r while it runs and free afterwards (a partial block).
"""

from __future__ import annotations

import numpy as np
from numba import literally, njit

from tongyi_trace.sim.policies import fifo, gdsf, lfu, lru, oracle, s3fifo, wa
from tongyi_trace.sim.structs import G_CURSOR, G_SIZE, PINNED, PRESENT, read_cycles

# stats vector layout
S_REFS, S_HITS, S_TOKENS, S_HIT_TOKENS, S_EVICTIONS, S_EVICT_CYCLES, S_BYPASS, S_TOUCHED = range(8)
NUM_STATS = 8


@njit(cache=True, inline="always")
def _access(pid: int, bk: np.ndarray, ft: np.ndarray, hp: np.ndarray, hk: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, x: int) -> None:
    if pid == 0:
        lru.access(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)
    elif pid == 1:
        fifo.access(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)
    elif pid == 2:
        lfu.access(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)
    elif pid == 3:
        s3fifo.access(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)
    elif pid == 4:
        gdsf.access(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)
    elif pid == 5:
        wa.access(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)
    else:
        oracle.access(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)


@njit(cache=True, inline="always")
def _insert(pid: int, bk: np.ndarray, ft: np.ndarray, hp: np.ndarray, hk: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, x: int) -> None:
    if pid == 0:
        lru.insert(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)
    elif pid == 1:
        fifo.insert(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)
    elif pid == 2:
        lfu.insert(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)
    elif pid == 3:
        s3fifo.insert(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)
    elif pid == 4:
        gdsf.insert(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)
    elif pid == 5:
        wa.insert(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)
    else:
        oracle.insert(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)


@njit(cache=True, inline="always")
def _release(pid: int, bk: np.ndarray, ft: np.ndarray, hp: np.ndarray, hk: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, x: int, ref: int, pos: int, ntok: int, c: int, now: float) -> None:
    if pid == 0:
        lru.release(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x, ref, pos, ntok, c, now)
    elif pid == 1:
        fifo.release(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x, ref, pos, ntok, c, now)
    elif pid == 2:
        lfu.release(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x, ref, pos, ntok, c, now)
    elif pid == 3:
        s3fifo.release(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x, ref, pos, ntok, c, now)
    elif pid == 4:
        gdsf.release(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x, ref, pos, ntok, c, now)
    elif pid == 5:
        wa.release(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x, ref, pos, ntok, c, now)
    else:
        oracle.release(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x, ref, pos, ntok, c, now)


@njit(cache=True, inline="always")
def _evict(pid: int, bk: np.ndarray, ft: np.ndarray, hp: np.ndarray, hk: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray, now: float) -> int:
    if pid == 0:
        return lru.evict(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, now)
    if pid == 1:
        return fifo.evict(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, now)
    if pid == 2:
        return lfu.evict(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, now)
    if pid == 3:
        return s3fifo.evict(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, now)
    if pid == 4:
        return gdsf.evict(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, now)
    if pid == 5:
        return wa.evict(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, now)
    return oracle.evict(bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, now)


@njit(cache=True)
def run_kernel(pid: int, req_off: np.ndarray, blk: np.ndarray, ntok: np.ndarray, req_cat: np.ndarray,
               req_time: np.ndarray, req_maxhit: np.ndarray, req_nstat: np.ndarray, req_extra: np.ndarray,
               capacity: int, bk: np.ndarray, ft: np.ndarray, hp: np.ndarray, hk: np.ndarray, g: np.ndarray, gf: np.ndarray,
               qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, cw: np.ndarray, nxt: np.ndarray,
               timing: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Replay the request stream through policy PID at CAPACITY blocks, on the state arrays made by
    structs.make_state (policy parameters in ip/fp, WA category parameters in cw, ORACLE next uses in nxt).

    Returns (stats[NUM_STATS], per-request hit blocks, per-request hit tokens, per-category
    [refs, hits, tokens, hit_tokens] as a (num_cats, 4) array)."""
    literally(pid)  # compile one specialization per policy: the dispatch branches fold away
    n_req = req_off.shape[0] - 1
    stats = np.zeros(NUM_STATS, np.int64)
    req_hits = np.zeros(n_req, np.int64)
    req_hit_tokens = np.zeros(n_req, np.int64)
    num_cats = 1
    for r in range(n_req):
        num_cats = max(num_cats, req_cat[r] + 1)
    cat_stats = np.zeros((num_cats, 4), np.int64)
    present = bk[PRESENT]
    pinned = bk[PINNED]
    for r in range(n_req):
        s = req_off[r]
        n = req_off[r + 1] - s
        now = req_time[r]
        c = req_cat[r]
        nstat = req_nstat[r]
        g[G_CURSOR] = -1
        # 1. longest cached prefix
        h = 0
        lim = min(n, req_maxhit[r])
        while h < lim and present[blk[s + h]] == 1:
            x = blk[s + h]
            if pinned[x] == 1:  # the same id twice in one request: the prefix stops there
                break
            pinned[x] = 1
            _access(pid, bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)
            h += 1
        hits = min(h, nstat)
        hit_tok = 0
        for k in range(hits):
            hit_tok += ntok[s + k]
        # 2. the rest: touch what is cached, insert what is not
        cap = capacity - req_extra[r]
        full = False
        for k in range(h, n):
            x = blk[s + k]
            if present[x] == 1:
                if pinned[x] == 0:
                    pinned[x] = 1
                    _access(pid, bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)
                    if k < nstat:
                        stats[S_TOUCHED] += 1
                continue
            if full:
                stats[S_BYPASS] += 1
                continue
            if g[G_SIZE] >= cap:
                t0 = read_cycles() if timing else np.uint64(0)
                while g[G_SIZE] >= cap:
                    v = _evict(pid, bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, now)
                    if v < 0:
                        break
                    present[v] = 0
                    g[G_SIZE] -= 1
                    stats[S_EVICTIONS] += 1
                if timing:
                    stats[S_EVICT_CYCLES] += np.int64(read_cycles() - t0)
                if g[G_SIZE] >= cap:
                    full = True
                    stats[S_BYPASS] += 1
                    continue
            present[x] = 1
            pinned[x] = 1
            g[G_SIZE] += 1
            _insert(pid, bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x)
        # 3. served: release deepest first
        for k in range(n - 1, -1, -1):
            x = blk[s + k]
            if pinned[x] == 1:
                pinned[x] = 0
                _release(pid, bk, ft, hp, hk, g, gf, qs, ip, fp, cw, nxt, x, s + k, k, ntok[s + k], c, now)
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
    return stats, req_hits, req_hit_tokens, cat_stats
