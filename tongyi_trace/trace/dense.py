"""Dense renumbering of 64-bit chain ids in order of first appearance, streaming over batches.

The first batch (ingest: a whole trace of up to millions of references) is dictionary-encoded by Arrow's
hash kernel, which numbers its ids in order of first appearance, with no compiler to load (ingest starts
fast). A later batch goes to a compiled hash table (trace/id_table.py, made once from the first batch's
ids), so a trace in many batches costs one look-up per reference, not a re-hash of every id seen per batch.
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
