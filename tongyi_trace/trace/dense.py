"""Dense renumbering of 64-bit chain ids in order of first appearance, streaming over batches: DenseIds
(any ids, hashed) and ChainNumbers (ingest's chain_idx: by block id where the trace allows, else DenseIds).

DenseIds: the first batch (in ingest, the first chunk of 1 M references, or the chains ChainNumbers
numbered before it switched) is dictionary-encoded by Arrow's hash kernel, which numbers its ids in order
of first appearance, with no compiler to load (a one-chunk ingest starts fast). A later batch goes to a
compiled hash table (trace/id_table.py, made once from the first batch's ids), so a trace in many batches
costs one look-up per reference, not a re-hash of every id seen per batch.
Memory: ~8 bytes per distinct id for one batch, 23-46 bytes beyond; references themselves are not held.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa

if TYPE_CHECKING:
    from tongyi_trace.trace.id_table import IdTable


class DenseIds:
    """Maps chain ids to 0, 1, 2, ... in order of first appearance across successive calls."""

    def __init__(self) -> None:
        self._first: pa.Array | None = None  # the first batch's distinct ids, in the order of their numbers
        self._table: IdTable | None = None  # from the second batch on
        self.num_distinct = 0

    def assign(self, chain: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Dense ids of CHAIN (new ids get the next numbers, in order)."""
        ids = np.ascontiguousarray(chain, dtype=np.int64).reshape(-1)
        if self._first is None and self._table is None:
            enc = pa.array(ids).dictionary_encode()
            self._first, self.num_distinct = enc.dictionary, len(enc.dictionary)
            return enc.indices.to_numpy().astype(np.int64)
        if self._table is None:
            from tongyi_trace.trace.id_table import IdTable  # compiled: loaded only for a second batch

            assert self._first is not None
            self._table, self._first = IdTable(self._first.to_numpy()), None
        out = self._table.assign(ids)
        self.num_distinct = self._table.num_distinct
        return out


_DIRECT_MIN_SLOTS = 1 << 20  # the block-id table may always grow this far; beyond, to one slot per reference seen
_NONE = np.iinfo(np.int64).max


class ChainNumbers:
    """chain_idx: dense numbers of the prefix chains (trace/chain.py) of successive chunks of requests, in
    order of first appearance; the same numbers as DenseIds over the chain ids, found without hashing when
    the trace allows it.

    Direct mode: when a trace's block ids are small non-negative integers and each id always follows the same
    block id (or always starts its request), every occurrence of an id has the same whole prefix (by induction
    over the position), so chains and block ids partition the references alike (Mooncake's chained ids and
    kvtrace synth's, for instance); a chain's number is then its block id's, kept in a table indexed by the
    id (NUM, with PRED the id it follows, -1 at a request's start). The first chunk that breaks this (an id
    outside the table's reach, or an id after a second predecessor) switches for good to DenseIds over the
    chain ids, seeded with the chains numbered so far in the order of their numbers: the numbering goes on
    unchanged. (Direct mode is exact; DenseIds would merge two chains whose 64-bit ids collide,
    probability ~ n^2 / 2^65.) Memory: 24 bytes per table slot, at most max(2^20, references seen) slots."""

    def __init__(self) -> None:
        self._num = np.full(0, -1, np.int64)  # per block id: its number, -1 = not seen
        self._pred = np.full(0, -1, np.int64)  # per seen block id: the id it follows, -1 = a request's start
        self._first = np.full(0, _NONE, np.int64)  # scratch of _direct, all _NONE between calls
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
            self._num = self._pred = self._first = np.full(0, -1, np.int64)
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
        pred = np.empty_like(ids)  # the id each reference follows; -1 at a request's start
        pred[1:] = ids[:-1]
        starts = offsets[:-1][np.diff(offsets) > 0]
        pred[starts] = -1
        seen = self._num[ids] >= 0
        if not np.array_equal(self._pred[ids[seen]], pred[seen]):
            return None
        new_at = np.flatnonzero(~seen)
        new_ids = ids[new_at]
        first_at = self._first  # the chunk's first reference of each new id (reset to NONE after use)
        np.minimum.at(first_at, new_ids, new_at)
        new_first_at = first_at[new_ids]
        first_at[new_ids] = _NONE
        first = new_at[new_first_at == new_at]  # in order of first appearance
        if not np.array_equal(pred[new_at], pred[new_first_at]):
            return None
        self._num[ids[first]] = np.arange(self.num_distinct, self.num_distinct + first.shape[0])
        self._pred[ids[first]] = pred[first]
        self._chains.append(np.asarray(chain, np.int64)[first])
        self.num_distinct += int(first.shape[0])
        return self._num[ids]

    def _reach(self, size: int) -> bool:
        """Grow the tables to hold ids below SIZE; False when that is more than the memory bound allows."""
        if size <= self._num.shape[0]:
            return True
        if size > max(_DIRECT_MIN_SLOTS, self._refs):
            return False
        slots = min(max(size, 2 * self._num.shape[0]), max(_DIRECT_MIN_SLOTS, self._refs))
        for name, fill in (("_num", -1), ("_pred", -1), ("_first", _NONE)):
            old = getattr(self, name)
            grown = np.full(slots, fill, np.int64)
            grown[:old.shape[0]] = old
            setattr(self, name, grown)
        return True
