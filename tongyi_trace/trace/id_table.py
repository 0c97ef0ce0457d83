"""An open-addressing hash table from 64-bit ids to their dense numbers, compiled with numba: what
trace/dense.DenseIds numbers with, kept across batches, so that numbering a trace stays linear in its
references however many batches it comes in (one look-up or insert per reference; the table grows by
doubling, each id moved once per growth).

Slots: SLOTS[s] = (the id, its number; -1 = empty), side by side so that a probe reads one cache line;
linear probing from a multiplicative (Fibonacci) hash of the id, so dense integers spread as well as
uniform chain ids. Kept at most MAX_LOAD full.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

MAX_LOAD = 0.7
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True)
def _slot(key: np.int64, shift: np.uint64) -> np.int64:
    return np.int64((np.uint64(key) * _GOLDEN) >> shift)


@njit(cache=True, nogil=True)
def _assign(slots: np.ndarray, shift: np.uint64, ids: np.ndarray, start: int, out: np.ndarray, num: int,
            limit: int) -> tuple[int, int]:
    """Number IDS[start:] into OUT (known ids their number, new ones NUM, NUM + 1, ...) until the table
    holds LIMIT ids; return (the next number, where it stopped)."""
    mask = slots.shape[0] - 1
    for i in range(start, ids.shape[0]):
        if num >= limit:
            return num, i
        k = ids[i]
        s = _slot(k, shift)
        while True:
            v = slots[s, 1]
            if v < 0:
                slots[s, 0] = k
                slots[s, 1] = num
                out[i] = num
                num += 1
                break
            if slots[s, 0] == k:
                out[i] = v
                break
            s = (s + 1) & mask
    return num, ids.shape[0]


@njit(cache=True, nogil=True)
def _move(slots: np.ndarray, new: np.ndarray, shift: np.uint64) -> None:
    """Insert every id of the table SLOTS into the empty table NEW."""
    mask = new.shape[0] - 1
    for j in range(slots.shape[0]):
        if slots[j, 1] < 0:
            continue
        s = _slot(slots[j, 0], shift)
        while new[s, 1] >= 0:
            s = (s + 1) & mask
        new[s, 0] = slots[j, 0]
        new[s, 1] = slots[j, 1]


class IdTable:
    """Dense numbers of 64-bit ids, continuing from the ids already numbered (SEEN, in order)."""

    def __init__(self, seen: npt.NDArray[np.int64]) -> None:
        self.slots, self.shift = _empty(max(16, int(seen.shape[0] / MAX_LOAD) + 1))
        self.num_distinct = 0
        self.assign(np.ascontiguousarray(seen, dtype=np.int64))

    def assign(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Dense numbers of IDS (new ids get the next numbers, in order)."""
        out = np.empty(ids.shape[0], np.int64)
        start = 0
        while True:
            limit = int(self.slots.shape[0] * MAX_LOAD)
            self.num_distinct, start = _assign(self.slots, self.shift, ids, start, out, self.num_distinct, limit)
            if start == ids.shape[0]:
                return out
            slots, shift = _empty(2 * self.slots.shape[0])
            _move(self.slots, slots, shift)
            self.slots, self.shift = slots, shift


def _empty(min_slots: int) -> tuple[npt.NDArray[np.int64], np.uint64]:
    """An empty table of at least MIN_SLOTS slots (a power of two) and its hash shift."""
    bits = max(4, int(min_slots - 1).bit_length())
    return np.full((1 << bits, 2), -1, np.int64), np.uint64(64 - bits)
