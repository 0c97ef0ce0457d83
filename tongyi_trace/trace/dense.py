"""Dense renumbering of 64-bit chain ids in order of first appearance, one streaming pass.

An open-addressing hash table (linear probing, compiled with numba) maps chain_id -> chain_idx; the
ids are already well mixed hashes, so their low bits index the table. Memory is ~32 bytes per
distinct block (the table stays at most half full); block references themselves are not held.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit


@njit(cache=True)
def _assign(keys: npt.NDArray[np.int64], vals: npt.NDArray[np.int64], ids: npt.NDArray[np.int64],
            next_idx: int, out: npt.NDArray[np.int64]) -> int:
    mask = keys.shape[0] - 1
    for i in range(ids.shape[0]):
        k = ids[i]
        slot = k & mask
        while True:
            v = vals[slot]
            if v == -1:
                keys[slot] = k
                vals[slot] = next_idx
                out[i] = next_idx
                next_idx += 1
                break
            if keys[slot] == k:
                out[i] = v
                break
            slot = (slot + 1) & mask
    return next_idx


class DenseIds:
    """Maps chain ids to 0, 1, 2, ... in order of first appearance across successive calls."""

    def __init__(self, capacity: int = 1 << 16) -> None:
        size = 1 << max(4, int(capacity - 1).bit_length())
        self._keys = np.zeros(size, dtype=np.int64)
        self._vals = np.full(size, -1, dtype=np.int64)
        self.num_distinct = 0

    def _grow(self, needed: int) -> None:
        size = self._keys.shape[0]
        if 2 * needed <= size:
            return
        while 2 * needed > size:
            size *= 4
        used = self._vals != -1
        in_order = np.empty(self.num_distinct, dtype=np.int64)
        in_order[self._vals[used]] = self._keys[used]  # the known ids in order of their numbers
        self._keys = np.zeros(size, dtype=np.int64)
        self._vals = np.full(size, -1, dtype=np.int64)
        _assign(self._keys, self._vals, in_order, 0, np.empty_like(in_order))

    def assign(self, chain: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Dense ids of CHAIN (new ids get the next numbers, in order)."""
        self._grow(self.num_distinct + chain.shape[0])
        out = np.empty(chain.shape[0], dtype=np.int64)
        self.num_distinct = _assign(self._keys, self._vals, np.ascontiguousarray(chain, dtype=np.int64),
                                    self.num_distinct, out)
        return out
