"""Reading KV-cache traces chunk by chunk, so memory stays bounded: `read_chunks` hands a trace to the
reader of its format. The parts: trace/source.py (bytes, decompression, lines), trace/formats.py (format
detection and options), trace/records.py (the record checks and the chunk columns), trace/jsonl_reader.py,
trace/aiperf_reader.py and trace/parquet_reader.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tongyi_trace.errors import InputError
from tongyi_trace.trace.aiperf_reader import read_aiperf
from tongyi_trace.trace.formats import check_options
from tongyi_trace.trace.jsonl_reader import read_jsonl
from tongyi_trace.trace.parquet_reader import read_parquet
from tongyi_trace.trace.records import Chunk, ReadStats
from tongyi_trace.trace.source import check_trace_path


def read_chunks(path: Path, fmt: str, on_error: str, stats: ReadStats) -> Iterator[Chunk]:
    """Parse PATH of format FMT chunk by chunk; ON_ERROR 'fail' raises on a bad line, 'skip' counts it."""
    check_options(fmt, on_error, None)
    if fmt == "parquet":
        return read_parquet(path, stats)
    check_trace_path(path)
    with path.open("rb") as f:
        if f.read(4) == b"PAR1":
            raise InputError(f"{path}: a Parquet file read as {fmt} JSONL; drop --format {fmt} or pass "
                             "--format parquet")
    if fmt == "aiperf":
        return read_aiperf(path, on_error, stats)
    return read_jsonl(path, fmt, on_error, stats)
