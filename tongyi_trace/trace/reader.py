"""Reading KV-cache traces: format detection, decompression, per-line validation, chunked parsing.

Formats (paper-notes "The traces"):
- bailian: Qwen-Bailian JSONL: chat_id, parent_chat_id (-1 root), timestamp (s), input_length,
  output_length, type, turn, hash_ids (one id per 16-token block); optional user_id.
- mooncake: Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (512-token blocks).
- parquet: the Bailian fields as columns (hash_ids a list column), as written by `kvtrace export`.
Input may be .gz or .zst compressed. Records are parsed in fixed-size chunks, so memory stays bounded.
"""

from __future__ import annotations

import gzip
import io
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow.parquet as pq

from tongyi_trace.errors import InputError, UsageError, located

FORMATS = ("bailian", "mooncake", "parquet")
DEFAULT_BLOCK_SIZE = {"bailian": 16, "mooncake": 512, "parquet": 16}
CHUNK_LINES = 20_000
PARQUET_BLOCK_SIZE_KEY = b"kvtrace.block_size"
_INT = (int,)
_NUM = (int, float)
# field -> (accepted Python types, required, description for messages)
_BAILIAN: dict[str, tuple[tuple[type, ...], str]] = {
    "chat_id": (_INT, "an integer"),
    "parent_chat_id": (_INT, "an integer (-1 for a root)"),
    "timestamp": (_NUM, "a number of seconds"),
    "input_length": (_INT, "an integer token count"),
    "output_length": (_INT, "an integer token count"),
    "type": ((str,), "a string"),
    "turn": (_INT, "an integer"),
    "hash_ids": ((list,), "a list of integers"),
}
_MOONCAKE: dict[str, tuple[tuple[type, ...], str]] = {
    "timestamp": (_NUM, "a number of milliseconds"),
    "input_length": (_INT, "an integer token count"),
    "output_length": (_INT, "an integer token count"),
    "hash_ids": ((list,), "a list of integers"),
}
_FIX = "fix the line or pass --on-error skip to skip such lines"


@dataclass
class Chunk:
    """A batch of parsed requests in file order: per-request columns and the flat hash ids."""

    line_no: npt.NDArray[np.int64]
    chat_id: npt.NDArray[np.int64]
    parent_chat_id: npt.NDArray[np.int64]
    timestamp_s: npt.NDArray[np.float64]
    input_tokens: npt.NDArray[np.int64]
    output_tokens: npt.NDArray[np.int64]
    type: list[str | None]
    turn: list[int | None]
    user_id: list[str | None]
    hash_ids: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.line_no.shape[0])


@dataclass
class ReadStats:
    """What the reader skipped or noticed while reading."""

    num_lines: int = 0
    num_blank: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def note(self, kind: str, example: str) -> None:
        """Count one finding of KIND, keeping the first few examples."""
        self.skipped[kind] += 1
        ex = self.examples.setdefault(kind, [])
        if len(ex) < 5:
            ex.append(example)


def _open_binary(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if path.suffix == ".zst":
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(path.open("rb")))
    return path.open("rb")


def detect_format(path: Path) -> str:
    """The trace format of PATH from its first record (bailian, mooncake or parquet)."""
    if not path.is_file():
        raise InputError(f"{path}: no such file; check the trace path")
    with path.open("rb") as f:
        if f.read(4) == b"PAR1":
            return "parquet"
    with _open_binary(path) as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise located(path, line_no, None, f"the first record is not valid JSON ({e})",
                              "is this a JSONL trace? pass --format to force one") from None
            if not isinstance(rec, dict):
                raise located(path, line_no, None, "the first record is not a JSON object", "check the file")
            if "chat_id" in rec:
                return "bailian"
            if "hash_ids" in rec and "timestamp" in rec:
                return "mooncake"
            raise located(path, line_no, None, f"unknown record with fields {sorted(rec)[:8]}",
                          "expected Bailian (chat_id, hash_ids, ...) or Mooncake (timestamp, hash_ids, ...) JSONL")
    raise InputError(f"{path}: the file is empty (no records); give a trace with at least one request")


def _check_record(path: Path, line_no: int, rec: Any, spec: dict[str, tuple[tuple[type, ...], str]]
                  ) -> npt.NDArray[np.int64]:
    """Validate one decoded record; return its hash ids as an int64 array."""
    if not isinstance(rec, dict):
        raise located(path, line_no, None, "the line is not a JSON object", _FIX)
    for name, (types, desc) in spec.items():
        if name not in rec:
            raise located(path, line_no, name, "is missing", _FIX)
        v = rec[name]
        if isinstance(v, bool) or not isinstance(v, types):
            raise located(path, line_no, name, f"must be {desc}, got {v!r:.40}", _FIX)
    for name in ("input_length", "output_length"):
        if rec[name] < 0:
            raise located(path, line_no, name, f"is negative ({rec[name]})", "lengths are token counts >= 0")
    hashes = rec["hash_ids"]
    arr = np.array(hashes) if hashes else np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        bad = next((h for h in hashes if isinstance(h, bool) or not isinstance(h, int)), hashes)
        raise located(path, line_no, "hash_ids", f"must be a list of integers, found {bad!r:.40}", _FIX)
    return arr.astype(np.int64, copy=False)


def _empty_chunk_lists() -> dict[str, list[Any]]:
    return {k: [] for k in ("line_no", "chat_id", "parent", "ts", "inp", "out", "type", "turn", "user", "hashes")}


def _to_chunk(c: dict[str, list[Any]]) -> Chunk:
    lengths = np.fromiter((len(h) for h in c["hashes"]), dtype=np.int64, count=len(c["hashes"]))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(c["hashes"]) if c["hashes"] else np.zeros(0, dtype=np.int64)
    return Chunk(
        line_no=np.asarray(c["line_no"], dtype=np.int64),
        chat_id=np.asarray(c["chat_id"], dtype=np.int64),
        parent_chat_id=np.asarray(c["parent"], dtype=np.int64),
        timestamp_s=np.asarray(c["ts"], dtype=np.float64),
        input_tokens=np.asarray(c["inp"], dtype=np.int64),
        output_tokens=np.asarray(c["out"], dtype=np.int64),
        type=c["type"], turn=c["turn"], user_id=c["user"],
        hash_ids=flat.astype(np.int64, copy=False), offsets=offsets,
    )


def _read_jsonl(path: Path, fmt: str, on_error: str, stats: ReadStats) -> Iterator[Chunk]:
    spec = _BAILIAN if fmt == "bailian" else _MOONCAKE
    bailian = fmt == "bailian"
    c = _empty_chunk_lists()
    with _open_binary(path) as f:
        for line_no, line in enumerate(f, start=1):
            stats.num_lines += 1
            if not line.strip():
                stats.num_blank += 1
                continue
            try:
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    raise located(path, line_no, None, f"malformed JSON ({e})", _FIX) from None
                hashes = _check_record(path, line_no, rec, spec)
                if bailian and "user_id" in rec and rec["user_id"] is not None \
                        and not isinstance(rec["user_id"], str | int):
                    raise located(path, line_no, "user_id",
                                  f"must be a string or integer, got {rec['user_id']!r:.40}", _FIX)
            except InputError as e:
                if on_error != "skip":
                    raise
                stats.note("skipped_lines", str(e))
                continue
            c["line_no"].append(line_no)
            c["ts"].append(rec["timestamp"] if bailian else rec["timestamp"] / 1000.0)
            c["inp"].append(rec["input_length"])
            c["out"].append(rec["output_length"])
            c["hashes"].append(hashes)
            if bailian:
                c["chat_id"].append(rec["chat_id"])
                c["parent"].append(rec["parent_chat_id"])
                c["type"].append(rec["type"])
                c["turn"].append(rec["turn"])
                uid = rec.get("user_id")
                c["user"].append(None if uid is None else str(uid))
            else:
                c["chat_id"].append(-1)  # assigned from the arrival order later
                c["parent"].append(-1)
                c["type"].append(None)
                c["turn"].append(None)
                c["user"].append(None)
            if len(c["line_no"]) >= CHUNK_LINES:
                yield _to_chunk(c)
                c = _empty_chunk_lists()
    if c["line_no"]:
        yield _to_chunk(c)


_PARQUET_COLUMNS = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type",
                    "turn", "hash_ids")


def _read_parquet(path: Path, stats: ReadStats) -> Iterator[Chunk]:
    pf = pq.ParquetFile(path)
    names = set(pf.schema_arrow.names)
    missing = [c for c in _PARQUET_COLUMNS if c not in names]
    if missing:
        raise InputError(f"{path}: column '{missing[0]}' is missing; a Parquet trace needs the columns "
                         f"{', '.join(_PARQUET_COLUMNS)} (write one with 'kvtrace export')")
    cols = [*_PARQUET_COLUMNS, *(["user_id"] if "user_id" in names else [])]
    row0 = 0
    for batch in pf.iter_batches(batch_size=CHUNK_LINES, columns=cols):
        n = batch.num_rows
        stats.num_lines += n
        hashes = batch.column("hash_ids")
        offsets = np.asarray(hashes.offsets, dtype=np.int64)
        offsets = offsets - offsets[0]
        inp = batch.column("input_length").to_numpy(zero_copy_only=False).astype(np.int64)
        out = batch.column("output_length").to_numpy(zero_copy_only=False).astype(np.int64)
        for name, arr in (("input_length", inp), ("output_length", out)):
            if (arr < 0).any():
                i = int(np.argmax(arr < 0))
                raise located(path, row0 + i + 1, name, f"is negative ({arr[i]}) in row {row0 + i + 1}",
                              "lengths are token counts >= 0")
        yield Chunk(
            line_no=np.arange(row0 + 1, row0 + n + 1, dtype=np.int64),
            chat_id=batch.column("chat_id").to_numpy(zero_copy_only=False).astype(np.int64),
            parent_chat_id=batch.column("parent_chat_id").to_numpy(zero_copy_only=False).astype(np.int64),
            timestamp_s=batch.column("timestamp").to_numpy(zero_copy_only=False).astype(np.float64),
            input_tokens=inp, output_tokens=out,
            type=batch.column("type").to_pylist(),
            turn=batch.column("turn").to_pylist(),
            user_id=batch.column("user_id").to_pylist() if "user_id" in cols else [None] * n,
            hash_ids=np.asarray(hashes.values.to_numpy(zero_copy_only=False), dtype=np.int64),
            offsets=offsets,
        )
        row0 += n


def default_block_size(path: Path, fmt: str) -> int:
    """Tokens per hash id: the format's default, or what a kvtrace Parquet trace records."""
    if fmt == "parquet":
        meta = pq.read_schema(path).metadata or {}
        if PARQUET_BLOCK_SIZE_KEY in meta:
            return int(meta[PARQUET_BLOCK_SIZE_KEY])
    return DEFAULT_BLOCK_SIZE[fmt]


def read_chunks(path: Path, fmt: str, on_error: str, stats: ReadStats) -> Iterator[Chunk]:
    """Parse PATH of format FMT chunk by chunk; ON_ERROR 'fail' raises on a bad line, 'skip' counts it."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if on_error not in ("fail", "skip"):
        raise UsageError(f"--on-error must be 'fail' or 'skip', got {on_error!r}")
    if fmt == "parquet":
        return _read_parquet(path, stats)
    return _read_jsonl(path, fmt, on_error, stats)
