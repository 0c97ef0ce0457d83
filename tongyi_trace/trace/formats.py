"""The trace formats kvtrace reads (bailian, mooncake, aiperf: JSONL; parquet: the Bailian fields as columns,
as written by `kvtrace export`), their detection from the first record, their default block sizes and the
checks of the reading options.

- bailian: Qwen-Bailian JSONL: chat_id, parent_chat_id (-1 root), timestamp (s), input_length,
  output_length, type, turn, hash_ids (one id per 16-token block); optional user_id.
- mooncake: Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (512-token blocks).
- aiperf: AIPerf's mooncake_trace: the Mooncake fields with session_id and delay (ms after the previous
  turn of the session) instead of, or beside, timestamp (trace/aiperf_reader.py; 512-token blocks).
- parquet: the Bailian fields as columns (hash_ids a list column).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from tongyi_trace.errors import InputError, UsageError, located
from tongyi_trace.trace.parquet_reader import PARQUET_BLOCK_SIZE_KEY, parquet_file
from tongyi_trace.trace.records import MAX_BLOCK_SIZE, show
from tongyi_trace.trace.source import check_trace_path, iter_lines

FORMATS = ("bailian", "mooncake", "aiperf", "parquet")
DEFAULT_BLOCK_SIZE = {"bailian": 16, "mooncake": 512, "aiperf": 512, "parquet": 16}
AIPERF_FIELDS = ("session_id", "delay")  # a record with one of these (or without a timestamp) is AIPerf's


# A line `kvtrace capture` writes says who made its parent_chat_id and turn: the capture's session linker
# (trace/sessions.py), not a server's own conversation ids; ingest's provenance then says "inferred".
LINKED_BY_FIELD = "linked_by"
CAPTURE_LINKER = "kvtrace capture"


def detect_format(path: Path) -> str:
    """The trace format of PATH from its first record (bailian, mooncake, aiperf or parquet)."""
    check_trace_path(path)
    with path.open("rb") as f:
        if f.read(4) == b"PAR1":
            return "parquet"
    line_no, rec = first_record(path)
    if "chat_id" in rec:
        return "bailian"
    if "hash_ids" in rec and "input_length" in rec and (any(k in rec for k in AIPERF_FIELDS)
                                                       or "timestamp" not in rec):
        return "aiperf"
    if "hash_ids" in rec and "timestamp" in rec:
        return "mooncake"
    names = [str(k) for k in sorted(rec)]
    fields = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    raise located(path, line_no, None, f"unknown record with fields {fields or '(none)'}",
                  "expected Bailian (chat_id, hash_ids, ...), Mooncake (timestamp, hash_ids, ...) or AIPerf "
                  "(session_id, delay, input_length, hash_ids, ...) JSONL")


def first_record(path: Path) -> tuple[int, dict[str, Any]]:
    """(line number, record) of the first non-blank line of the JSONL trace PATH."""
    for line_no, line in iter_lines(path):
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise located(path, line_no, None, f"the first record is not valid JSON ({e})",
                          "is this a JSONL trace? pass --format to force one") from None
        if not isinstance(rec, dict):
            raise located(path, line_no, None, "the first record is not a JSON object", "check the file")
        return line_no, rec
    raise InputError(f"{path}: the file is empty (no records); give a trace with at least one request")


def linked_by(path: Path) -> str | None:
    """Who linked the Bailian JSONL trace PATH's requests (its first record's `linked_by`, e.g. CAPTURE_LINKER),
    or None when the links are the trace's own."""
    value = first_record(path)[1].get(LINKED_BY_FIELD)
    return value if isinstance(value, str) else None


def default_block_size(path: Path, fmt: str) -> int:
    """Tokens per hash id: the format's default, or what a kvtrace Parquet trace records."""
    if fmt == "parquet":
        meta = parquet_file(path).schema_arrow.metadata or {}
        if PARQUET_BLOCK_SIZE_KEY in meta:
            raw = meta[PARQUET_BLOCK_SIZE_KEY]
            try:
                value = int(raw)
            except ValueError:
                value = 0
            if not 1 <= value <= MAX_BLOCK_SIZE:
                raise InputError(f"{path}: metadata '{PARQUET_BLOCK_SIZE_KEY.decode()}' is {show(raw)}, not a "
                                 f"block size in 1..{MAX_BLOCK_SIZE}; pass --block-size")
            return value
    return DEFAULT_BLOCK_SIZE[fmt]


def check_options(fmt: str, on_error: str, block_size: int | None) -> None:
    """Raise UsageError for a format, error mode or block size kvtrace does not take."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: unknown trace format; choose one of {', '.join(FORMATS)}")
    if on_error not in ("fail", "skip"):
        raise UsageError(f"--on-error must be 'fail' or 'skip', got {on_error!r}")
    if block_size is not None and not (type(block_size) is int and 1 <= block_size <= MAX_BLOCK_SIZE):
        raise UsageError(f"--block-size {block_size}: give a number of tokens in 1..{MAX_BLOCK_SIZE}")
