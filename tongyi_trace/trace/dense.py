"""Dense renumbering of 64-bit chain ids in order of first appearance, streaming over batches.

Arrow's hash kernels do the work (no compiler, so ingest starts fast): the first batch is dictionary-encoded,
which numbers its ids in order of first appearance; in a later batch, the ids already seen are looked up
among them (index_in: the position in that order is the number) and the others are dictionary-encoded
among themselves, numbered after. Memory is ~8 bytes per distinct block plus one look-up's hash set; block
references themselves are not held. A look-up hashes every id seen so far, so callers pass large batches
(ingest: millions of references).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc


class DenseIds:
    """Maps chain ids to 0, 1, 2, ... in order of first appearance across successive calls."""

    def __init__(self) -> None:
        self._seen: list[pa.Array] = []  # the ids seen, in the order of their numbers
        self.num_distinct = 0

    def assign(self, chain: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Dense ids of CHAIN (new ids get the next numbers, in order)."""
        ids = pa.array(np.ascontiguousarray(chain, dtype=np.int64).reshape(-1))
        if self.num_distinct == 0:
            enc = ids.dictionary_encode()
            self._seen, self.num_distinct = [enc.dictionary], len(enc.dictionary)
            return enc.indices.to_numpy().astype(np.int64)
        seen = pa.concat_arrays(self._seen) if len(self._seen) > 1 else self._seen[0]
        self._seen = [seen]
        known = pc.index_in(ids, value_set=seen)
        out = known.fill_null(-1).to_numpy().astype(np.int64)
        if known.null_count:
            enc = ids.filter(known.is_null()).dictionary_encode()
            out[out < 0] = enc.indices.to_numpy() + self.num_distinct
            self._seen.append(enc.dictionary)
            self.num_distinct += len(enc.dictionary)
        return out
