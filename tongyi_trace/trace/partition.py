"""Partitions of a run's block references by a hash of the chained block id (`--executor ray` of analyze
and fit): block chain_id belongs to partition splitmix64(chain_id) mod N, so every reference of a block (its
first use, its reuse gaps, its lifespan) is in one partition; the content-hit analysis partitions by block_id
the same way. A partition is read by streaming blocks.parquet batch by batch and keeping only its rows
(the hash is the predicate: row groups cannot be skipped, but a reader never holds the whole table). On one
machine the table is instead split in one pass into a file per partition (split_partitions), so that N
partitions cost one scan, not N.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from tongyi_trace.errors import KvtraceError
from tongyi_trace.executor import PartitionOptions, TaskOutcome, check_partitions, map_tasks
from tongyi_trace.run import RunTables
from tongyi_trace.splitmix import splitmix64

BATCH_ROWS = 1 << 18  # rows of blocks.parquet decoded at once by a partition's reader
BLOCK_COLUMNS = ("req_idx", "pos", "block_id", "chain_id", "chain_idx", "num_tokens")


def partition_of(ids: npt.NDArray[np.int64], num_partitions: int) -> npt.NDArray[np.uint64]:
    """The partition of each 64-bit id: splitmix64(id) mod NUM_PARTITIONS."""
    return splitmix64(ids.view(np.uint64)) % np.uint64(num_partitions)


def read_partition(tables: RunTables, part: int, num_partitions: int, columns: Sequence[str] = BLOCK_COLUMNS,
                   by_block_id: bool = True) -> tuple[pa.Table, pa.Table | None]:
    """The rows of blocks.parquet in partition PART of NUM_PARTITIONS, in the table's (req_idx, pos) order: by
    chain_id (COLUMNS) and, when BY_BLOCK_ID, by block_id (req_idx, block_id; else None)."""
    need = list(dict.fromkeys([*columns, "chain_id", *(("req_idx", "block_id") if by_block_id else ())]))
    by_chain: list[pa.RecordBatch] = []
    by_block: list[pa.RecordBatch] = []
    pf = pq.ParquetFile(tables.blocks_path, pre_buffer=False)  # pre-buffering keeps whole column chunks: 2x RSS
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=need):
        in_chain = partition_of(batch.column("chain_id").to_numpy(), num_partitions) == part
        by_chain.append(batch.select(list(columns)).filter(pa.array(in_chain)))
        if by_block_id:
            in_block = partition_of(batch.column("block_id").to_numpy(), num_partitions) == part
            by_block.append(batch.select(["req_idx", "block_id"]).filter(pa.array(in_block)))
    schema = pf.schema_arrow
    chains = pa.Table.from_batches(by_chain, pa.schema([schema.field(c) for c in columns]))
    if not by_block_id:
        return chains, None
    return chains, pa.Table.from_batches(by_block, pa.schema([schema.field(c) for c in ("req_idx", "block_id")]))


def split_partitions(tables: RunTables, num_partitions: int, columns: Sequence[str], out_dir: Path) -> list[Path]:
    """One pass over blocks.parquet: the COLUMNS of each partition's rows (by chain_id) written to their own
    Arrow IPC file in OUT_DIR, in the table's (req_idx, pos) order; the files in partition order. A local
    executor then reads each partition once (read_split) instead of scanning the whole table per partition."""
    paths = [out_dir / f"part-{p}.arrow" for p in range(num_partitions)]
    pf = pq.ParquetFile(tables.blocks_path, pre_buffer=False)
    schema = pa.schema([pf.schema_arrow.field(c) for c in columns])
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(pa.ipc.new_file(str(path), schema)) for path in paths]
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=list(dict.fromkeys([*columns, "chain_id"]))):
            part = partition_of(batch.column("chain_id").to_numpy(), num_partitions)
            rows = batch.select(list(columns))
            for p, writer in enumerate(writers):
                writer.write_batch(rows.filter(pa.array(part == p)))
    return paths


def read_split(path: Path) -> pa.Table:
    """A partition's rows written by split_partitions."""
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def map_partitions(fn: Callable[[int, Mapping[str, Any]], Any], tables: RunTables, opts: PartitionOptions,
                   shared: Mapping[str, Any], what: str,
                   on_partition: Callable[[int, int], None] | None = None) -> list[Any]:
    """FN(part, shared) for each partition of OPTS on its executor, SHARED given `tables` (TABLES with absolute
    paths: read on other nodes) and `num_partitions`; the values in partition order. ON_PARTITION(finished,
    total) as each ends. One failed partition fails the whole: a KvtraceError naming WHAT and the first error."""
    num = check_partitions(opts.num_partitions)
    tables = replace(tables, requests_path=tables.requests_path.resolve(), blocks_path=tables.blocks_path.resolve())
    values: dict[int, Any] = {}
    errors: list[str] = []

    def done(out: TaskOutcome) -> None:
        if out.ok:
            values[out.index] = out.value
        else:
            errors.append(f"partition {out.index}: {out.error}")
        if on_partition is not None:
            on_partition(len(values) + len(errors), num)

    map_tasks(fn, list(range(num)), {**shared, "tables": tables, "num_partitions": num}, done, opts.executor)
    if errors:
        raise KvtraceError(f"{what} --executor {opts.executor.kind}: {len(errors)} of {num} partitions failed "
                           f"({errors[0]}); nothing was written, run again")
    return [values[p] for p in range(num)]
