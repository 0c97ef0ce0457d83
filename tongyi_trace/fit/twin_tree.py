"""The twin's prefix tree held as segments, and its figures without expanding a block list.

A drawn twin (fit/synth_twin.py) is a prefix tree: request i's blocks are its donor's first kk[i]
blocks, then n[i] - kk[i] new ones. Its path is thus a few segments, each a run of one creator's new
blocks (creator c's blocks sit at depths kk[c]..n[c]-1 of every path through them): a request's path
is its donor's segments cut at kk[i], then its own. A full-size profile twin has 3-15 M blocks but
only ~10^5 segments, and each of its 17 variants is scored on its reuse-time CDF (and the closest on
their LRU curve), so the figures are computed over segments:

- every access to creator c's blocks covers a prefix of them (depths kk[c]..e-1), so the time of the
  last access of c's blocks falls with their depth: a staircase, kept per creator as a stack of
  (end depth, request) steps, shallowest (the most recent) on top. An access pops the steps it covers
  (each a run of blocks last used by one request) and pushes its own: amortized O(segments).
- the reuse-time histogram counts each popped run at its reuse time (the reuse_time analysis's log
  bins, as synth_twin.reuse_time_cdf does block by block).
- the LRU curve (Mattson stack distances with the prefix rule, exactly as sim/lru_curve.py): a run
  last used by request r holds consecutive stamps (r's blocks are stamped deepest first), so its
  blocks' stack distances are d, d + 1, ..., and the max-prefix distances a clamped ramp; the live
  stamps are counted by a Fenwick tree with range updates, O(log R) per run instead of per block.
`tests/calibration/test_twin.py` checks both against the block-by-block computations, exactly.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from tongyi_trace.analysis.common import BIN_MAX, BIN_MIN, BIN_ZERO, BINS_PER_DECADE

NUM_REUSE_BINS = BIN_MAX - BIN_ZERO + 1  # the reuse-time CDF's log bins (BIN_ZERO, then BIN_MIN..BIN_MAX)
I64 = npt.NDArray[np.int64]


@njit(cache=True)
def reuse_bin(gap_s: float) -> int:
    """The reuse_time analysis's log bin of a reuse after GAP_S, as an index from BIN_ZERO."""
    if gap_s <= 0.0:
        return 0
    return min(max(int(np.ceil(BINS_PER_DECADE * np.log10(gap_s))), BIN_MIN), BIN_MAX) - BIN_ZERO


@njit(cache=True)
def _bit_add(tree: np.ndarray, i: int, v: int) -> None:
    while i < tree.shape[0]:
        tree[i] += v
        i += i & (-i)


@njit(cache=True)
def _bit_sum(tree: np.ndarray, i: int) -> int:
    s = 0
    while i > 0:
        s += tree[i]
        i -= i & (-i)
    return s


@njit(cache=True)
def _range_add(b1: np.ndarray, b2: np.ndarray, lo: int, hi: int, v: int) -> None:
    """Add V to every stamp in [LO, HI] (1-based)."""
    _bit_add(b1, lo, v)
    _bit_add(b1, hi + 1, -v)
    _bit_add(b2, lo, v * (lo - 1))
    _bit_add(b2, hi + 1, -v * hi)


@njit(cache=True)
def _prefix_count(b1: np.ndarray, b2: np.ndarray, i: int) -> int:
    """Live stamps in [1, I]."""
    return _bit_sum(b1, i) * i - _bit_sum(b2, i)


@njit(cache=True)
def tree_figures(donor: np.ndarray, kk: np.ndarray, n: np.ndarray,
                 arrival_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reuse-time histogram (reuses per log bin: BIN_ZERO, then BIN_MIN..BIN_MAX) of the tree
    (DONOR, KK, N; requests in arrival order at ARRIVAL_S), and its max-prefix stack distances
    differenced (the cumulative sum of the second at d: the references that hit in an LRU cache of d
    blocks or more; the never-used ones left out), as the block-by-block computations give them."""
    num = n.shape[0]
    # the requests' paths as segments (creator, end depth), in depth order
    cap = 2 * num + 16
    seg_c = np.empty(cap, np.int64)
    seg_e = np.empty(cap, np.int64)
    seg_off = np.zeros(num + 1, np.int64)
    m = 0
    for i in range(num):
        d = donor[i]
        need = m + (seg_off[d + 1] - seg_off[d] if d >= 0 else 0) + 1
        if need > cap:
            cap = max(2 * cap, need)
            c2 = np.empty(cap, np.int64)
            e2 = np.empty(cap, np.int64)
            c2[:m] = seg_c[:m]
            e2[:m] = seg_e[:m]
            seg_c, seg_e = c2, e2
        if d >= 0 and kk[i] > 0:
            start = 0
            for s in range(seg_off[d], seg_off[d + 1]):
                if start >= kk[i]:
                    break
                seg_c[m] = seg_c[s]
                seg_e[m] = min(seg_e[s], kk[i])
                start = seg_e[s]
                m += 1
        if n[i] > kk[i]:
            seg_c[m] = i
            seg_e[m] = n[i]
            m += 1
        seg_off[i + 1] = m
    # per creator a stack of steps (end depth, request that last used the blocks above that end)
    head = np.full(num, -1, np.int64)
    st_end = np.empty(m, np.int64)
    st_req = np.empty(m, np.int64)
    st_below = np.empty(m, np.int64)
    num_st = 0
    hist = np.zeros(NUM_REUSE_BINS, np.int64)
    num_refs = 0
    num_ids = 0
    for i in range(num):
        num_refs += n[i]
        num_ids += n[i] - kk[i]
    b1 = np.zeros(num_refs + 2, np.int64)  # live stamps (Fenwick, range updates)
    b2 = np.zeros(num_refs + 2, np.int64)
    last_stamp = np.zeros(num, np.int64)  # the stamp of each request's depth 0 (depth p: that - p)
    diff = np.zeros(num_ids + 3, np.int64)  # max-prefix distances, differenced
    run_req = np.empty(m + 1, np.int64)  # this request's runs: who used them last, depths [a, b)
    run_a = np.empty(m + 1, np.int64)
    run_b = np.empty(m + 1, np.int64)
    live = 0
    stamp = 0
    for i in range(num):
        t = arrival_s[i]
        num_runs = 0
        for s in range(seg_off[i], seg_off[i + 1]):
            c = seg_c[s]
            e = seg_e[s]
            if c != i:
                prev = kk[c]
                top = head[c]
                while top >= 0 and prev < e:
                    b = min(st_end[top], e)
                    r = st_req[top]
                    hist[reuse_bin(t - arrival_s[r])] += b - prev
                    run_req[num_runs] = r
                    run_a[num_runs] = prev
                    run_b[num_runs] = b
                    num_runs += 1
                    prev = b
                    if st_end[top] <= e:
                        top = st_below[top]
                    else:
                        break
                head[c] = top
            st_end[num_st] = e
            st_req[num_st] = i
            st_below[num_st] = head[c]
            head[c] = num_st
            num_st += 1
        dmax = 0
        for x in range(num_runs):
            r, a, b = run_req[x], run_a[x], run_b[x]
            length = b - a
            tau = last_stamp[r] - a
            d0 = live - _prefix_count(b1, b2, tau - 1)  # live stamps >= tau
            top_d = d0 + length - 1
            if dmax >= top_d:
                diff[dmax] += length
                diff[dmax + 1] -= length
            else:
                if dmax >= d0:
                    clamped = dmax - d0 + 1
                    diff[dmax] += clamped
                    diff[dmax + 1] -= clamped
                    lo = dmax + 1
                else:
                    lo = d0
                # one reference at each distance lo..top_d: a second-order difference
                diff[lo] += 1
                diff[top_d + 1] -= 1
                dmax = top_d
        for x in range(num_runs):
            r, a, b = run_req[x], run_a[x], run_b[x]
            _range_add(b1, b2, last_stamp[r] - b + 1, last_stamp[r] - a, -1)
        live += n[i] - kk[i]
        if n[i] > 0:
            _range_add(b1, b2, stamp + 1, stamp + n[i], 1)
            stamp += n[i]
        last_stamp[i] = stamp
    return hist, diff
