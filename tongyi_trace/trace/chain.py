"""Prefix-chained block identity.

chain_k = mix(chain_{k-1}, block_id_k) with chain_{-1} = a fixed seed: two blocks get the same chain id
iff every block from position 0 up to and including them is equal (up to 64-bit hash collisions,
probability ~ n^2 / 2^65). Bailian (Qwen) hash ids are per-block content hashes, so the engine-visible
identity must be derived this way; for already-chained ids (Mooncake) it yields the same partition.
Compiled with numba: one pass over the flat id array, no Python loop per block; mix is splitmix64
(tongyi_trace/splitmix.py, compiled here from that same function).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np
import numpy.typing as npt
from numba import njit

from tongyi_trace import splitmix

_SEED = np.uint64(0x6B76747261636521)  # "kvtrace!"


# compiled, it mixes one uint64 (the numpy form works elementwise on arrays)
_splitmix64 = cast(Callable[[np.uint64], np.uint64], njit(cache=True, inline="always")(splitmix.splitmix64))


@njit(cache=True)
def _chain(block_ids: npt.NDArray[np.uint64], offsets: npt.NDArray[np.int64], seed: np.uint64
           ) -> npt.NDArray[np.uint64]:
    out = np.empty(block_ids.shape[0], dtype=np.uint64)
    for r in range(offsets.shape[0] - 1):
        h = seed
        for i in range(offsets[r], offsets[r + 1]):
            h = _splitmix64(h ^ _splitmix64(block_ids[i]))
            out[i] = h
    return out


def chain_ids(block_ids: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Prefix-chained 64-bit ids (as int64) for flat BLOCK_IDS split into requests at OFFSETS (len N+1)."""
    ids = np.ascontiguousarray(block_ids, dtype=np.int64).view(np.uint64)
    return _chain(ids, np.ascontiguousarray(offsets, dtype=np.int64), _SEED).view(np.int64)
