"""The shared `chains` table of the analyses, computed with numpy: one row per distinct prefix-chained block.

Columns and meaning are those of queries/chains_table.sql, the reference (tests/analysis/test_chains.py
holds the two equal): chain_idx, the first and last request using it (first_req, last_req), its number of
references, the tokens it held in the first request, that request's arrival time and category, and the last
request's arrival time. Ingest numbers chains 0..D-1 and requests 0..N-1, so per-chain values are plain
arrays indexed by chain_idx, filled by one streamed pass over blocks.parquet (~40 bytes per chain), and
request attributes are gathered by req_idx: no hash aggregation or join.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tongyi_trace.errors import InputError
from tongyi_trace.run import RunTables

_BATCH_ROWS = 1 << 22


def chains_table(tables: RunTables, num_chains: int) -> pa.Table:
    """The chains table of the run (TABLES), whose chain_idx are 0..NUM_CHAINS-1 (provenance
    num_distinct_blocks); rows in chain_idx order."""
    reqs = pq.read_table(tables.requests_path, columns=["req_idx", "arrival_s", "category"])
    if not np.array_equal(reqs["req_idx"].to_numpy(), np.arange(reqs.num_rows)):
        raise InputError(f"{tables.requests_path}: req_idx is not 0, 1, 2, ... in row order; re-run 'kvtrace ingest'")
    first = np.full(num_chains, np.iinfo(np.int64).max, np.int64)
    last = np.full(num_chains, -1, np.int64)
    count = np.zeros(num_chains, np.int64)
    first_tokens = np.zeros(num_chains, np.int64)
    for batch in pq.ParquetFile(tables.blocks_path).iter_batches(batch_size=_BATCH_ROWS,
                                                               columns=["req_idx", "chain_idx", "num_tokens"]):
        req = batch.column("req_idx").to_numpy()
        chain = batch.column("chain_idx").to_numpy()
        if chain.shape[0] and not (int(chain.min()) >= 0 and int(chain.max()) < num_chains
                                   and int(req.min()) >= 0 and int(req.max()) < reqs.num_rows):
            raise InputError(f"{tables.blocks_path}: a chain_idx or req_idx is out of the run's range; "
                             "re-run 'kvtrace ingest'")
        np.minimum.at(first, chain, req)
        np.maximum.at(last, chain, req)
        np.add.at(count, chain, 1)  # not a bincount of all D chains per batch: linear in the trace
        at_first = req == first[chain]  # the reference in the first request (so far) of its chain
        first_tokens[chain[at_first]] = batch.column("num_tokens").to_numpy()[at_first]
    present = np.flatnonzero(count)
    first, last = first[present], last[present]
    arrival = reqs["arrival_s"].to_numpy()
    return pa.table({
        "chain_idx": present.astype(np.int64), "first_req": first, "last_req": last,
        "num_accesses": count[present], "first_num_tokens": first_tokens[present],
        "first_arrival_s": arrival[first], "last_arrival_s": arrival[last],
        "first_category": reqs["category"].take(pa.array(first)),
    })
