"""fit/twin_tree.py: the twin's reuse-time histogram and LRU curve over its tree's segments equal the
block-by-block computations (synth_twin's reuse histogram, sim/lru_curve.py's exact curve), on random
trees (hypothesis) and on the drawn twin of the Mooncake conversation trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.fit.synth_like import load_workload, trace_size
from tongyi_trace.fit.synth_twin import _reuse_hist, _tree_nodes, draw_twin
from tongyi_trace.fit.twin_tree import tree_figures
from tongyi_trace.sim.lru_curve import lru_curve
from tongyi_trace.sim.stream import Stream


def _block_by_block(donor: np.ndarray, kk: np.ndarray, n: np.ndarray,
                    arrival_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reuse histogram and the LRU curve's cumulative hits of the expanded block lists."""
    nodes, offsets = _tree_nodes(donor, kk, n)
    num_ids = int((n - kk).sum())
    num = n.size
    stream = Stream(req_off=offsets, blk=nodes, ntok=np.ones(nodes.size, dtype=np.int64),
                    req_cat=np.zeros(num, dtype=np.int64), req_time_s=arrival_s, req_tokens=n,
                    categories=("all",), num_ids=num_ids, block_size=16, req_idx=np.arange(num, dtype=np.int64))
    return _reuse_hist(offsets, nodes, arrival_s, num_ids), lru_curve(stream).cum_hits


def _segments_figures(donor: np.ndarray, kk: np.ndarray, n: np.ndarray,
                      arrival_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    hist, diff = tree_figures(donor, kk, n, arrival_s)
    num_ids = int((n - kk).sum())
    return hist, np.cumsum(np.cumsum(diff))[:num_ids + 1]


@st.composite
def trees(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Requests in arrival order, each taking a random earlier one's first kk blocks (or none)."""
    num = draw(st.integers(1, 40))
    n = np.asarray(draw(st.lists(st.integers(0, 12), min_size=num, max_size=num)), dtype=np.int64)
    donor = np.full(num, -1, dtype=np.int64)
    kk = np.zeros(num, dtype=np.int64)
    for i in range(1, num):
        if draw(st.booleans()):
            d = draw(st.integers(0, i - 1))
            donor[i] = d
            kk[i] = draw(st.integers(0, int(min(n[d], n[i]))))
            if kk[i] == 0:
                donor[i] = -1
    # arrivals: some at the same instant, gaps across the log bins (ms to hours)
    gaps = draw(st.lists(st.sampled_from([0.0, 0.004, 0.3, 2.0, 45.0, 900.0, 7000.0]), min_size=num, max_size=num))
    return donor, kk, n, np.cumsum(np.asarray(gaps, dtype=np.float64))


@settings(max_examples=examples(200), deadline=None)
@given(trees())
def test_segments_equal_block_by_block_on_random_trees(tree: tuple[np.ndarray, ...]) -> None:
    hist, cum = _segments_figures(*tree)
    want_hist, want_cum = _block_by_block(*tree)
    assert hist.tolist() == want_hist.tolist()
    assert cum.tolist() == want_cum.tolist()


def test_segments_equal_block_by_block_on_a_drawn_twin(mooncake_conversation_run: Path) -> None:
    """The Mooncake conversation trace's twin at seed 1: 12,031 requests, 289,063 blocks."""
    wl = load_workload(mooncake_conversation_run)
    num, duration_s = trace_size(1, wl.num_requests, wl.duration_s, 1.0)
    tw = draw_twin(wl.twin, np.random.default_rng(1), num, duration_s, wl.block_size)
    n = np.diff(tw.offsets)
    # the donors again from the ids: a request's donor is the last earlier one holding its deepest shared id
    last_holder: dict[int, int] = {}
    donor = np.full(num, -1, dtype=np.int64)
    for i in range(num):
        ids = tw.hash_ids[tw.offsets[i]:tw.offsets[i + 1]]
        if tw.shared_blocks[i] > 0:
            donor[i] = last_holder[int(ids[tw.shared_blocks[i] - 1])]
        for b in ids.tolist():
            last_holder[b] = i
    arrival_s = tw.arrival_ms / 1000.0
    assert n.sum() == 289_063
    hist, cum = _segments_figures(donor, tw.shared_blocks, n, arrival_s)
    want_hist, want_cum = _block_by_block(donor, tw.shared_blocks, n, arrival_s)
    assert hist.tolist() == want_hist.tolist() and hist.sum() == tw.shared_blocks.sum()
    assert cum.tolist() == want_cum.tolist()
