"""splitmix64 has one definition (tongyi_trace/splitmix.py): the in-place numpy steps that chain block ids
and the python-integer form the plugin samples with are held to it, bit for bit, on random inputs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.splitmix import GOLDEN, mix64, splitmix64
from tongyi_trace.trace import chain
from tongyi_trace.trace.chain import chain_ids

U64 = st.integers(0, 2**64 - 1)


def test_matches_the_reference_generator() -> None:
    # SplitMix64 (Steele et al. 2014) seeded with 0: its first two outputs are mix(G) and mix(2G).
    out = splitmix64(np.array([0, int(GOLDEN)], dtype=np.uint64))
    assert [hex(int(v)) for v in out] == ["0xe220a8397b1dcdaf", "0x6e789e6aa1b965f4"]


@settings(max_examples=examples(300), deadline=None)
@given(U64)
def test_python_int_form_equals_the_definition(x: int) -> None:
    want = int(splitmix64(np.array([x], dtype=np.uint64))[0])
    assert mix64(x) == want
    assert mix64(x - 2**64) == want  # python ints are taken modulo 2^64


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.lists(U64, max_size=5), min_size=1, max_size=6))
def test_chain_ids_follow_the_recurrence(reqs: list[list[int]]) -> None:
    """chain_k = mix64(chain_{k-1} ^ mix64(block_k)) from the seed, per request, in python integers: the
    vectorised steps (requests of different lengths advanced together) give the same ids."""
    offsets = np.zeros(len(reqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(r) for r in reqs])
    flat = np.array([b for r in reqs for b in r], dtype=np.uint64).view(np.int64)
    want = []
    for r in reqs:
        h = int(chain._SEED)
        for b in r:
            h = mix64(h ^ mix64(b))
            want.append(h)
    assert chain_ids(flat, offsets).view(np.uint64).tolist() == want


def test_chain_ids_mix_with_the_definition() -> None:
    """Requests of one block: chain id = mix(seed ^ mix(block id))."""
    ids = np.random.default_rng(13).integers(-(2**63), 2**63 - 1, size=2000, dtype=np.int64)
    got = chain_ids(ids, np.arange(ids.size + 1, dtype=np.int64)).view(np.uint64)
    want = splitmix64(chain._SEED ^ splitmix64(ids.view(np.uint64)))
    np.testing.assert_array_equal(got, want)
