"""Prefix-chained block identity.

chain_k = mix(chain_{k-1}, block_id_k) with chain_{-1} = a fixed seed: two blocks get the same chain id
iff every block from position 0 up to and including them is equal (up to 64-bit hash collisions,
probability ~ n^2 / 2^65). Bailian (Qwen) hash ids are per-block content hashes, so the engine-visible
identity must be derived this way; for already-chained ids (Mooncake) it yields the same partition.
mix(h, b) = splitmix64(h ^ splitmix64(b)), splitmix64 as defined in tongyi_trace/splitmix.py (its compiled
form here; tests/trace/test_splitmix.py holds the two to each other). Compiled with numba, like the JSONL
scan that feeds it at ingest: one pass along each request.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from tongyi_trace.splitmix import CHAIN_SEED, GOLDEN, M1, M2

_SEED = CHAIN_SEED
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


@njit(cache=True, nogil=True, inline="always")
def _splitmix64(x: np.uint64) -> np.uint64:
    z = x + GOLDEN
    z = (z ^ (z >> _S30)) * M1
    z = (z ^ (z >> _S27)) * M2
    return z ^ (z >> _S31)


@njit(cache=True, nogil=True)
def _chain(ids: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> None:
    for r in range(offsets.shape[0] - 1):
        h = _SEED
        for i in range(offsets[r], offsets[r + 1]):
            h = _splitmix64(h ^ _splitmix64(ids[i]))
            out[i] = h


def chain_ids(block_ids: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Prefix-chained 64-bit ids (as int64) for flat BLOCK_IDS split into requests at OFFSETS (len N+1)."""
    ids = np.ascontiguousarray(block_ids, dtype=np.int64).view(np.uint64)
    out = np.empty(ids.shape[0], dtype=np.uint64)
    _chain(ids, np.ascontiguousarray(offsets, dtype=np.int64), out)
    return out.view(np.int64)
