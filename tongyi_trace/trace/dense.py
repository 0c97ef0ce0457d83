"""Dense renumbering of 64-bit chain ids in order of first appearance, streaming over batches: DenseIds
(any ids, hashed) and ChainNumbers (ingest's chain_idx: by block id where the trace allows, else DenseIds).

DenseIds keeps a compiled hash table (trace/id_table.py) across batches, so a trace in many batches costs
one look-up per reference, not a re-hash of every id seen per batch. Memory: 23-46 bytes per distinct id;
references themselves are not held.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from tongyi_trace.trace.id_table import IdTable


class DenseIds:
    """Maps chain ids to 0, 1, 2, ... in order of first appearance across successive calls."""

    def __init__(self) -> None:
        self._table = IdTable(np.zeros(0, np.int64))
        self.num_distinct = 0

    def assign(self, chain: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Dense ids of CHAIN (new ids get the next numbers, in order)."""
        out = self._table.assign(np.ascontiguousarray(chain, dtype=np.int64).reshape(-1))
        self.num_distinct = self._table.num_distinct
        return out


_DIRECT_MIN_SLOTS = 1 << 20  # the block-id table may always grow this far; beyond, to one slot per reference seen


@njit(cache=True, nogil=True)
def _number_direct(ids: np.ndarray, offsets: np.ndarray, num: np.ndarray, pred: np.ndarray, next_num: int,
                   out: np.ndarray, firsts: np.ndarray) -> int:
    """Direct mode over one chunk (ChainNumbers): OUT = the number of each reference's block id (NUM holds
    number + 1, 0 = not seen), a new id numbered NEXT_NUM, NEXT_NUM + 1, ... and its predecessor recorded
    in PRED (read only where NUM is set); FIRSTS the positions of the new ids' first references. Returns
    how many ids were new, or -1 when an id follows another predecessor than before (NUM then restored)."""
    k = 0
    for r in range(offsets.shape[0] - 1):
        prev = -1
        for i in range(offsets[r], offsets[r + 1]):
            b = ids[i]
            if num[b] == 0:
                num[b], pred[b] = next_num + k + 1, prev
                firsts[k] = i
                k += 1
            elif pred[b] != prev:
                for j in range(k):
                    num[ids[firsts[j]]] = 0
                return -1
            out[i] = num[b] - 1
            prev = b
    return k


class ChainNumbers:
    """chain_idx: dense numbers of the prefix chains (trace/chain.py) of successive chunks of requests, in
    order of first appearance; the same numbers as DenseIds over the chain ids, found without hashing when
    the trace allows it.

    Direct mode: when a trace's block ids are small non-negative integers and each id always follows the same
    block id (or always starts its request), every occurrence of an id has the same whole prefix (by induction
    over the position), so chains and block ids partition the references alike (Mooncake's chained ids and
    kvtrace synth's, for instance); a chain's number is then its block id's, kept in a table indexed by the
    id (NUM, with PRED the id it follows, -1 at a request's start; both grow without touching the slots of
    ids not seen). The first chunk that breaks this (an id outside the table's reach, or an id after a
    second predecessor) switches for good to DenseIds over the chain ids, seeded with the chains numbered
    so far in the order of their numbers: the numbering goes on unchanged. (Direct mode is exact; DenseIds
    would merge two chains whose 64-bit ids collide, probability ~ n^2 / 2^65.) Memory: 16 bytes per table
    slot touched, at most max(2^20, references seen) slots."""

    def __init__(self) -> None:
        self._num = np.zeros(0, np.int64)  # per block id: its number + 1, 0 = not seen
        self._pred = np.zeros(0, np.int64)  # per seen block id: the id it follows, -1 = a request's start
        self._chains: list[npt.NDArray[np.int64]] = []  # direct mode: chain ids of numbers 0.., per chunk
        self._hashed: DenseIds | None = None
        self._refs = 0
        self.num_distinct = 0

    @property
    def direct(self) -> bool:
        """True while the chunks so far were numbered by block id (direct mode), False once switched."""
        return self._hashed is None

    def assign(self, block_ids: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64],
               chain: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """chain_idx of one chunk: BLOCK_IDS split into requests at OFFSETS (len N+1), CHAIN their chain ids."""
        self._refs += int(block_ids.shape[0])
        if self._hashed is None:
            out = self._direct(np.asarray(block_ids, np.int64), np.asarray(offsets, np.int64), chain)
            if out is not None:
                return out
            self._hashed = DenseIds()
            if self._chains:
                self._hashed.assign(np.concatenate(self._chains))
            self._num = self._pred = np.zeros(0, np.int64)
            self._chains = []
        out = self._hashed.assign(chain)
        self.num_distinct = self._hashed.num_distinct
        return out

    def _direct(self, ids: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64],
                chain: npt.NDArray[np.int64]) -> npt.NDArray[np.int64] | None:
        """The chunk's numbers in direct mode, or None (the tables untouched) when the chunk breaks it."""
        if ids.shape[0] == 0:
            return np.zeros(0, np.int64)
        if int(ids.min()) < 0 or not self._reach(int(ids.max()) + 1):
            return None
        out = np.empty_like(ids)
        firsts = np.empty_like(ids)
        num_new = _number_direct(ids, offsets, self._num, self._pred, self.num_distinct, out, firsts)
        if num_new < 0:
            return None
        self._chains.append(np.asarray(chain, np.int64)[firsts[:num_new]])
        self.num_distinct += num_new
        return out

    def _reach(self, size: int) -> bool:
        """Grow the tables to hold ids below SIZE; False when that is more than the memory bound allows."""
        if size <= self._num.shape[0]:
            return True
        if size > max(_DIRECT_MIN_SLOTS, self._refs):
            return False
        slots = min(max(size, 2 * self._num.shape[0]), max(_DIRECT_MIN_SLOTS, self._refs))
        # zeros and empty leave the pages beyond the ids seen untouched (the VM pays for a page's first touch)
        for name, fresh in (("_num", np.zeros), ("_pred", np.empty)):
            old = getattr(self, name)
            grown = fresh(slots, np.int64)
            grown[:old.shape[0]] = old
            setattr(self, name, grown)
        return True
