"""The spatial analysis counts head-window hits in one compiled pass over blocks.parquet, batch by batch
(analysis/spatial.py); it is held to the definition written as one plain loop over the references (module
docstring of spatial.py), on random prefix-sharing streams cut into random batches."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.analysis.spatial import STEPS, UNSEEN, _first_unsorted, _head_window_hits
from tongyi_trace.errors import InputError


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
    cols = (np.array(req, np.int64), np.array(pos, np.int64), np.array(chain, np.int64))
    lens_a, types = np.array(lens, np.int64), rng.integers(0, 3, size=len(lens)).astype(np.int64)
    cuts = np.sort(rng.integers(0, len(req) + 1, size=int(rng.integers(0, 5))))  # batches split requests too
    batches = [tuple(c[a:b] for c in cols) for a, b in zip([0, *cuts], [*cuts, len(req)], strict=True)]
    np.testing.assert_array_equal(_head_window_hits(batches, lens_a, types, len(chains), 3),
                                  _by_loop(*cols, lens_a, types, len(chains), 3))


def test_pass_refuses_rows_out_of_order() -> None:
    one = np.array([0, 1], np.int64)
    batches = [(np.zeros(2, np.int64), one, one), (np.zeros(1, np.int64), np.zeros(1, np.int64), one[:1])]
    with pytest.raises(InputError, match="row 2 breaks the"):
        _head_window_hits(batches, np.array([2]), np.zeros(1, np.int64), 2, 1)


def test_first_unsorted() -> None:
    req = np.array([0, 0, 1, 1, 1, 2], np.int32)
    assert _first_unsorted(req, np.array([0, 1, 0, 1, 2, 0], np.int32)) == -1
    assert _first_unsorted(req, np.array([0, 1, 0, 2, 1, 0], np.int32)) == 4
    assert _first_unsorted(np.array([0, 1, 0], np.int32), np.array([0, 0, 1], np.int32)) == 2
