"""The shared `chains` table of the analyses, computed with numpy: one row per distinct prefix-chained block.

Columns and meaning are those of queries/chains_table.sql, the reference (tests/analysis/test_chains.py
holds the two equal): chain_idx, the first and last request using it (first_req, last_req), its number of
references, the tokens it held in the first request, that request's arrival time and category, and the last
request's arrival time. Ingest numbers chains 0..D-1 and requests 0..N-1, so per-chain values are plain
arrays indexed by chain_idx, filled by one streamed pass over blocks.parquet (~16 bytes per chain: int32
where the run allows), and request attributes are gathered by req_idx: no hash aggregation or join.
`kvtrace analyze` writes the table into its DuckDB spill folder in slices (write_chains_table), so that
DuckDB reads it out of core.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tongyi_trace.errors import InputError
from tongyi_trace.run import RunTables

_BATCH_ROWS = 1 << 22
SLICE_CHAINS = 1 << 23  # chains of one written slice (~0.6 GB of columns)


def chains_table(tables: RunTables, num_chains: int) -> pa.Table:
    """The chains table of the run (TABLES), whose chain_idx are 0..NUM_CHAINS-1 (provenance
    num_distinct_blocks); rows in chain_idx order."""
    acc = _accumulate(tables, num_chains)
    return _rows(acc, 0, num_chains)


def write_chains_table(tables: RunTables, num_chains: int, path: Path, slice_chains: int = SLICE_CHAINS) -> Path:
    """chains_table of TABLES written to the Parquet file PATH, SLICE_CHAINS chains at a time: only the
    per-chain accumulators (~16 bytes per chain) and one slice are ever in memory, and DuckDB reads the
    table back out of core (what `kvtrace analyze` does, analysis/common.py)."""
    acc = _accumulate(tables, num_chains)
    schema = _rows(acc, 0, 0).schema
    with pq.ParquetWriter(path, schema, use_dictionary=["first_category"]) as writer:  # ints plain: faster
        for lo in range(0, num_chains, max(1, slice_chains)):
            writer.write_table(_rows(acc, lo, min(num_chains, lo + slice_chains)))
    return path


@dataclass(frozen=True)
class _Accumulated:
    """The per-chain values of one pass over blocks.parquet (int32 where the run's sizes allow) and the
    requests' arrival times and categories."""

    reqs: pa.Table
    first: np.ndarray
    last: np.ndarray
    count: np.ndarray
    first_tokens: np.ndarray


def _accumulate(tables: RunTables, num_chains: int) -> _Accumulated:
    """One streamed pass over blocks.parquet: per chain, its first and last request, its references and the
    tokens it held in its first request."""
    reqs = pq.read_table(tables.requests_path, columns=["req_idx", "arrival_s", "category"])
    if not np.array_equal(reqs["req_idx"].to_numpy(), np.arange(reqs.num_rows)):
        raise InputError(f"{tables.requests_path}: req_idx is not 0, 1, 2, ... in row order; re-run 'kvtrace ingest'")
    blocks = pq.ParquetFile(tables.blocks_path)
    small = np.int32 if max(reqs.num_rows, blocks.metadata.num_rows) < np.iinfo(np.int32).max else np.int64
    first = np.full(num_chains, np.iinfo(small).max, small)
    last = np.full(num_chains, -1, small)
    count = np.zeros(num_chains, small)
    first_tokens = np.zeros(num_chains, np.int32)
    for batch in blocks.iter_batches(batch_size=_BATCH_ROWS, columns=["req_idx", "chain_idx", "num_tokens"]):
        req = batch.column("req_idx").to_numpy()
        chain = batch.column("chain_idx").to_numpy()
        if chain.shape[0] and not (int(chain.min()) >= 0 and int(chain.max()) < num_chains
                                   and int(req.min()) >= 0 and int(req.max()) < reqs.num_rows):
            raise InputError(f"{tables.blocks_path}: a chain_idx or req_idx is out of the run's range; "
                             "re-run 'kvtrace ingest'")
        req = req.astype(small)
        np.minimum.at(first, chain, req)
        np.maximum.at(last, chain, req)
        np.add.at(count, chain, 1)  # not a bincount of all D chains per batch: linear in the trace
        at_first = req == first[chain]  # the reference in the first request (so far) of its chain
        first_tokens[chain[at_first]] = batch.column("num_tokens").to_numpy()[at_first]
    return _Accumulated(reqs, first, last, count, first_tokens)


def _rows(acc: _Accumulated, lo: int, hi: int) -> pa.Table:
    """The chains table's rows of the chains LO..HI-1 that are used (int64 columns, as chains_table.sql)."""
    present = lo + np.flatnonzero(acc.count[lo:hi])
    first, last = acc.first[present].astype(np.int64), acc.last[present].astype(np.int64)
    arrival = acc.reqs["arrival_s"].to_numpy()
    return pa.table({
        "chain_idx": present.astype(np.int64), "first_req": first, "last_req": last,
        "num_accesses": acc.count[present].astype(np.int64),
        "first_num_tokens": acc.first_tokens[present].astype(np.int64),
        "first_arrival_s": arrival[first], "last_arrival_s": arrival[last],
        "first_category": acc.reqs["category"].take(pa.array(first)),
    })
