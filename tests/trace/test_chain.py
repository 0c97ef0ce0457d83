"""Prefix-chained identity: equal chain ids iff equal whole prefixes (property test)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.trace.chain import chain_ids

requests_st = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=6), min_size=1, max_size=25)


def _flatten(reqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(reqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(r) for r in reqs])
    flat = np.array([b for r in reqs for b in r], dtype=np.int64)
    return flat, offsets


@settings(max_examples=examples(200), deadline=None)
@given(requests_st)
def test_chain_ids_equal_iff_prefixes_equal(reqs: list[list[int]]) -> None:
    flat, offsets = _flatten(reqs)
    chains = chain_ids(flat, offsets)
    prefixes = [tuple(r[: i + 1]) for r in reqs for i in range(len(r))]
    for i in range(len(prefixes)):
        for j in range(len(prefixes)):
            assert (chains[i] == chains[j]) == (prefixes[i] == prefixes[j])


@settings(max_examples=examples(100), deadline=None)
@given(requests_st)
def test_chained_ids_keep_their_partition(reqs: list[list[int]]) -> None:
    """Ids that are already prefix-chained (Mooncake) give the same partition as the ids themselves."""
    flat, offsets = _flatten(reqs)
    already = chain_ids(flat, offsets)  # a valid prefix-chained id stream
    rechained = chain_ids(already, offsets)
    assert len(set(zip(already.tolist(), rechained.tolist(), strict=True))) == len(set(already.tolist()))
    assert len(set(rechained.tolist())) == len(set(already.tolist()))
