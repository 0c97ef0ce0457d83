"""Chunks of a Parquet trace (the Bailian fields as typed columns, as `kvtrace export` writes them): the
columns' types checked once, then every batch's values against the ranges of trace/records.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from tongyi_trace.errors import InputError, brief, located
from tongyi_trace.trace.records import (
    CHUNK_LINES,
    CHUNK_REFS,
    INT64,
    MAX_ABS_TIME_S,
    MAX_TOKENS,
    MAX_TURN,
    Chunk,
    ReadStats,
)
from tongyi_trace.trace.source import check_trace_path

PROGRESS_LINES = 1 << 12  # the read's progress is reported every this many Parquet rows
PARQUET_BLOCK_SIZE_KEY = b"kvtrace.block_size"


def parquet_file(path: Path) -> pq.ParquetFile:
    check_trace_path(path)
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable Parquet file ({brief(str(e))}); is it "
                         "truncated, or another format? (pass --format bailian/mooncake for JSONL)") from None


_PARQUET_COLUMNS = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type",
                    "turn", "hash_ids")


_PARQUET_KINDS = {"chat_id": "integer", "parent_chat_id": "integer", "timestamp": "number",
                  "input_length": "integer", "output_length": "integer", "type": "string", "turn": "integer",
                  "hash_ids": "list of integers", "user_id": "string"}


def _parquet_kind_ok(kind: str, t: pa.DataType) -> bool:
    if kind == "integer":
        return bool(pa.types.is_integer(t))
    if kind == "number":
        return bool(pa.types.is_integer(t) or pa.types.is_floating(t))
    if kind == "string":
        if pa.types.is_dictionary(t):  # dictionary-encoded strings (pandas categoricals, Spark) are strings
            t = t.value_type
        return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t))
    return bool((pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type))


def _parquet_bad_row(path: Path, row0: int, mask: npt.NDArray[np.bool_], name: str, what: str) -> None:
    if mask.any():
        i = int(np.argmax(mask))
        raise located(path, row0 + i + 1, name, f"{what} (row {row0 + i + 1})", "fix the Parquet file")


def _parquet_ints(path: Path, batch: pa.RecordBatch, name: str, row0: int, lo: int, hi: int
                  ) -> npt.NDArray[np.int64]:
    col = batch.column(name)
    _parquet_bad_row(path, row0, np.asarray(col.is_null()), name, "is null")
    arr = col.to_numpy(zero_copy_only=False)
    if arr.dtype == np.uint64:
        _parquet_bad_row(path, row0, arr > np.uint64(hi), name, "is out of range")
    arr = arr.astype(np.int64)
    _parquet_bad_row(path, row0, (arr < lo) | (arr > hi), name, f"is out of range [{lo}, {hi}]")
    return arr


def _one_batch(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """BATCHES (one schema) as one record batch."""
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def read_parquet(path: Path, stats: ReadStats) -> Iterator[Chunk]:
    pf = parquet_file(path)
    schema = pf.schema_arrow
    missing = [c for c in _PARQUET_COLUMNS if c not in schema.names]
    if missing:
        raise InputError(f"{path}: column '{missing[0]}' is missing; a Parquet trace needs the columns "
                         f"{', '.join(_PARQUET_COLUMNS)} (write one with 'kvtrace export')")
    cols = [*_PARQUET_COLUMNS, *(["user_id"] if "user_id" in schema.names else [])]
    twice = [c for c in cols if schema.names.count(c) > 1]
    if twice:
        raise InputError(f"{path}: column '{twice[0]}' appears {schema.names.count(twice[0])} times; a Parquet "
                         "trace has each column once (write one with 'kvtrace export')")
    for name in cols:
        t = schema.field(name).type
        nullable = name in ("type", "turn", "user_id") and pa.types.is_null(t)
        if not (nullable or _parquet_kind_ok(_PARQUET_KINDS[name], t)):
            raise InputError(f"{path}: column '{name}' has type {t}, expected {_PARQUET_KINDS[name]}; "
                             "fix the Parquet file (write one with 'kvtrace export')")
    import pyarrow.compute as pc  # loaded for a Parquet trace only

    unsigned = pa.types.is_unsigned_integer(schema.field("hash_ids").type.value_type)
    row0 = 0
    try:
        size, num_rows = path.stat().st_size, max(pf.metadata.num_rows, 1)
        batches: list[pa.RecordBatch] = []
        rows = refs = 0
        for batch in pf.iter_batches(batch_size=PROGRESS_LINES, columns=cols):  # progress: the share of rows read
            batches.append(batch)
            rows += batch.num_rows
            refs += len(pc.list_flatten(batch.column("hash_ids")))
            stats.advanced(size * (row0 + rows) // num_rows)
            if rows >= CHUNK_LINES or refs >= CHUNK_REFS:
                yield _parquet_chunk(path, _one_batch(batches), row0, stats, unsigned)
                row0, batches, rows, refs = row0 + rows, [], 0, 0
        if batches:
            yield _parquet_chunk(path, _one_batch(batches), row0, stats, unsigned)
            row0 += rows
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{path}: unreadable Parquet data after row {row0} ({brief(str(e))}); "
                         "the file is damaged or truncated") from None


def _parquet_chunk(path: Path, batch: pa.RecordBatch, row0: int, stats: ReadStats, unsigned: bool) -> Chunk:
    n = batch.num_rows
    stats.num_lines += n
    hashes = batch.column("hash_ids")
    _parquet_bad_row(path, row0, np.asarray(hashes.is_null()), "hash_ids", "is null")
    values = hashes.flatten()
    if values.null_count:
        offs = np.asarray(hashes.offsets)
        first = int(np.argmax(np.asarray(values.is_null())))
        _parquet_bad_row(path, row0, (offs[:-1] <= first) & (first < offs[1:]), "hash_ids", "holds a null id")
    offsets = np.asarray(hashes.offsets, dtype=np.int64)
    offsets = offsets - offsets[0]
    ids = np.ascontiguousarray(values.to_numpy(zero_copy_only=False))
    if unsigned and ids.dtype == np.uint64 and (ids >= np.uint64(1 << 63)).any():
        stats.first_unsigned_line = stats.first_unsigned_line or row0 + 1
    ids = ids.astype(np.uint64 if unsigned else np.int64).view(np.int64) if ids.size else ids.astype(np.int64)
    ts_col = batch.column("timestamp")
    _parquet_bad_row(path, row0, np.asarray(ts_col.is_null()), "timestamp", "is null")
    ts = ts_col.to_numpy(zero_copy_only=False).astype(np.float64)
    _parquet_bad_row(path, row0, ~(np.abs(ts) <= MAX_ABS_TIME_S), "timestamp",
                     f"is not finite or out of range (|t| <= {MAX_ABS_TIME_S:g} s)")
    turn = batch.column("turn")
    tv = np.nan_to_num(turn.to_numpy(zero_copy_only=False).astype(np.float64), nan=0.0)  # null: no turn
    _parquet_bad_row(path, row0, (tv < 0) | (tv > MAX_TURN), "turn", f"is out of range [0, {MAX_TURN}]")
    return Chunk(
        line_no=np.arange(row0 + 1, row0 + n + 1, dtype=np.int64),
        chat_id=_parquet_ints(path, batch, "chat_id", row0, *INT64),
        parent_chat_id=_parquet_ints(path, batch, "parent_chat_id", row0, *INT64),
        timestamp_s=ts,
        input_tokens=_parquet_ints(path, batch, "input_length", row0, 0, MAX_TOKENS),
        output_tokens=_parquet_ints(path, batch, "output_length", row0, 0, MAX_TOKENS),
        type=batch.column("type").to_pylist(),
        turn=turn.to_pylist(),
        user_id=batch.column("user_id").to_pylist() if "user_id" in batch.schema.names else [None] * n,
        hash_ids=ids, offsets=offsets,
    )
