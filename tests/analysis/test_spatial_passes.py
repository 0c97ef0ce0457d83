"""The spatial analysis counts head-window hits with whole-array passes (analysis/spatial.py); they are held to
the definition written as one plain loop over the references (module docstring of spatial.py), on random
prefix-sharing streams."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.analysis.spatial import STEPS, UNSEEN, _first_unsorted, _head_window_hits


def _by_loop(req: np.ndarray, pos: np.ndarray, chain: np.ndarray, req_blocks: np.ndarray, req_type: np.ndarray,
             num_chains: int, num_types: int) -> np.ndarray:
    """The definition: per block the smallest stride (tenths) at which an earlier reference cached it; a
    reference hits from the running maximum of those over its request's positions, until one was never seen."""
    hits = np.zeros((num_types, STEPS + 1), np.int64)
    need = [int(UNSEEN)] * num_chains
    cur, run_max, matching = -1, 0, False
    for r, p, c in zip(req.tolist(), pos.tolist(), chain.tolist(), strict=True):
        if r != cur:
            cur, run_max, matching = r, 0, True
        if matching:
            if need[c] == UNSEEN:
                matching = False
            else:
                run_max = max(run_max, need[c])
                hits[req_type[r], run_max] += 1
        need[c] = min(need[c], STEPS * p // int(req_blocks[r]) + 1)
    return hits


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_passes_equal_the_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    chains: dict[tuple[int, ...], int] = {}
    prefixes: list[list[int]] = []
    req, pos, chain, lens = [], [], [], []
    for r in range(int(rng.integers(1, 30))):
        head = list(prefixes[int(rng.integers(0, len(prefixes)))]) if prefixes and rng.random() < 0.7 else []
        head = head[:int(rng.integers(0, len(head) + 1))]
        blocks = head + [int(b) for b in rng.integers(0, 4, size=int(rng.integers(1 if not head else 0, 12)))]
        prefixes.append(blocks)
        for p in range(len(blocks)):
            req.append(r)
            pos.append(p)
            chain.append(chains.setdefault(tuple(blocks[:p + 1]), len(chains)))
        lens.append(len(blocks))
    args = (np.array(req, np.int32), np.array(pos, np.int32), np.array(chain, np.int32), np.array(lens, np.int64),
            rng.integers(0, 3, size=len(lens)).astype(np.int32), len(chains), 3)
    np.testing.assert_array_equal(_head_window_hits(*args), _by_loop(*args))


def test_first_unsorted() -> None:
    req = np.array([0, 0, 1, 1, 1, 2], np.int32)
    assert _first_unsorted(req, np.array([0, 1, 0, 1, 2, 0], np.int32)) == -1
    assert _first_unsorted(req, np.array([0, 1, 0, 2, 1, 0], np.int32)) == 4
    assert _first_unsorted(np.array([0, 1, 0], np.int32), np.array([0, 0, 1], np.int32)) == 2
