"""ChainNumbers (ingest's chain_idx) equals the reference numbering, DenseIds over the chain ids, whichever
mode it runs in: by block id (direct mode) on traces whose ids each follow one predecessor, by chain id once
a chunk breaks that, switching mid-trace with the numbering carried over."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.run import open_run
from tongyi_trace.trace.chain import chain_ids
from tongyi_trace.trace.dense import ChainNumbers, DenseIds


def _flat(requests: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([b for r in requests for b in r], np.int64)
    offsets = np.zeros(len(requests) + 1, np.int64)
    np.cumsum([len(r) for r in requests], out=offsets[1:])
    return ids, offsets


def _numbered(requests: list[list[int]], cuts: list[int]) -> tuple[np.ndarray, ChainNumbers]:
    """ChainNumbers over REQUESTS fed in chunks of CUTS requests each (the rest in a last chunk)."""
    numbers, out, r0 = ChainNumbers(), [], 0
    for size in [*cuts, len(requests)]:
        part = requests[r0:r0 + size]
        ids, offsets = _flat(part)
        out.append(numbers.assign(ids, offsets, chain_ids(ids, offsets)))
        r0 = min(r0 + size, len(requests))
    return np.concatenate(out), numbers


def _reference(requests: list[list[int]]) -> np.ndarray:
    ids, offsets = _flat(requests)
    return DenseIds().assign(chain_ids(ids, offsets))


def _tree_requests(rng: np.random.Generator, num_requests: int, num_nodes: int) -> list[list[int]]:
    """Requests that are root-to-node paths of a random tree whose nodes are the block ids (so each id always
    follows the same id): the shape of Mooncake's chained ids and of kvtrace synth's."""
    parent = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, num_nodes)])
    ids = rng.permutation(num_nodes)  # ids not in tree order
    out = []
    for node in rng.integers(0, num_nodes, num_requests):
        path = []
        while node >= 0:
            path.append(int(ids[node]))
            node = parent[node]
        out.append(path[::-1])
    return out


@settings(max_examples=examples(60), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), cuts=st.lists(st.integers(0, 12), max_size=4))
def test_tree_traces_number_by_block_id(seed: int, cuts: list[int]) -> None:
    requests = _tree_requests(np.random.default_rng(seed), 40, 30)
    out, numbers = _numbered(requests, cuts)
    np.testing.assert_array_equal(out, _reference(requests))
    assert numbers.direct  # throughout
    assert numbers.num_distinct == len({b for r in requests for b in r})


@settings(max_examples=examples(100), deadline=None)
@given(requests=st.lists(st.lists(st.integers(0, 6), max_size=6), min_size=1, max_size=30),
       cuts=st.lists(st.integers(0, 12), max_size=4))
def test_any_trace_numbers_as_the_reference(requests: list[list[int]], cuts: list[int]) -> None:
    """Random lists: ids follow several predecessors, so the mode switches, often after a few direct chunks."""
    out, numbers = _numbered(requests, cuts)
    np.testing.assert_array_equal(out, _reference(requests))
    assert numbers.num_distinct == len(set(_reference(requests).tolist()))


def test_switch_mid_trace_keeps_the_numbering() -> None:
    """Three chunks of a tree trace run direct; a chunk of known ids in another order switches; the rest (a
    tree of its own) goes on numbered by chain id, every number as the reference's."""
    rng = np.random.default_rng(3)
    tree = _tree_requests(rng, 300, 200)
    a, b = next(r[:2] for r in tree if len(r) >= 2)
    requests = [*tree, [b, a], [a, b], *_tree_requests(rng, 100, 200)]
    numbers, out = ChainNumbers(), []
    for r0, r1 in ((0, 100), (100, 200), (200, 300), (300, 302), (302, len(requests))):
        ids, offsets = _flat(requests[r0:r1])
        out.append(numbers.assign(ids, offsets, chain_ids(ids, offsets)))
        assert numbers.direct == (r1 <= 300)  # direct until the known ids came in another order
    np.testing.assert_array_equal(np.concatenate(out), _reference(requests))


def test_ids_outside_the_table_switch() -> None:
    """Negative ids and ids far beyond the references seen (64-bit hashes) go to the chain-id numbering."""
    for big in (-5, 1 << 40):
        requests = [[1, 2, 3], [1, 2], [big, 2], [1, 2, 3]]
        out, numbers = _numbered(requests, [2])
        assert not numbers.direct
        np.testing.assert_array_equal(out, _reference(requests))


def test_ingest_numbers_real_traces_as_the_reference(mooncake_conversation_run: Path) -> None:
    """Mooncake's conversation trace (chained ids, in time order): ingest's chain_idx is the reference's."""
    blocks = open_run(mooncake_conversation_run).blocks(["req_idx", "pos", "chain_id", "chain_idx"])
    blocks = blocks.sort("req_idx", "pos")
    np.testing.assert_array_equal(blocks["chain_idx"].to_numpy(), DenseIds().assign(blocks["chain_id"].to_numpy()))
