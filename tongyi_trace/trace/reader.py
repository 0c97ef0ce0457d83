"""Reading KV-cache traces: format detection, decompression, per-line validation, chunked parsing.

Formats (paper-notes "The traces"):
- bailian: Qwen-Bailian JSONL: chat_id, parent_chat_id (-1 root), timestamp (s), input_length,
  output_length, type, turn, hash_ids (one id per 16-token block); optional user_id.
- mooncake: Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (512-token blocks).
- parquet: the Bailian fields as columns (hash_ids a list column), as written by `kvtrace export`.
Input may be .gz or .zst compressed. Records are parsed in fixed-size chunks, so memory stays bounded.
JSONL is read in blocks of bytes: a compiled scan (trace/jsonl_scan.py) parses the records of the usual
shape straight into columns, and leaves every other line to the precise per-line checks below
(_JsonlReader.line), which accept it or name its problem; tests/trace/test_jsonl_scan.py holds the two
paths to the same chunks, statistics and errors.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from tongyi_trace.errors import InputError, UsageError, located

FORMATS = ("bailian", "mooncake", "parquet")
DEFAULT_BLOCK_SIZE = {"bailian": 16, "mooncake": 512, "parquet": 16}
CHUNK_LINES = 1 << 18
BLOCK_BYTES = 1 << 20  # of the file (decompressed) read at a time
UTF8_BOM = b"\xef\xbb\xbf"  # a byte-order mark some editors put first (byte_blocks drops it)
PROGRESS_LINES = 1 << 12  # the read's progress is reported every this many Parquet rows
# hash ids per chunk (8 bytes each): small enough that a chunk's arrays are reused by the allocator instead of
# being mapped afresh (first-touch page faults cost more than the work on a large temporary); ingest's
# numbering (trace/dense.ChainNumbers) carries over from chunk to chunk
CHUNK_REFS = 1 << 20
PARQUET_BLOCK_SIZE_KEY = b"kvtrace.block_size"
# Ranges every later stage may rely on (validated here, once):
MAX_TOKENS = (1 << 31) - 1          # input/output lengths: 0..MAX_TOKENS
MAX_TURN = (1 << 31) - 1            # turn: 0..MAX_TURN
MAX_BLOCK_SIZE = 1 << 20            # tokens per hash id: 1..MAX_BLOCK_SIZE
MAX_ABS_TIME_S = 1e11               # |timestamp| in seconds (~3000 years)
INT64 = (-(1 << 63), (1 << 63) - 1)
# Block ids are 64-bit: a trace's ids are all signed int64 (negative ids allowed) or all unsigned uint64
# (ids >= 2^63 allowed); a trace with both is refused. block_id stores the 64-bit pattern as Int64, so
# distinct ids of one trace stay distinct (an unsigned id >= 2^63 appears as a negative number).
ID_DOMAINS = ("signed", "unsigned")


class _Int:
    """An integer field (booleans refused) within [lo, hi]."""

    def __init__(self, desc: str, lo: int = INT64[0], hi: int = INT64[1]) -> None:
        self.desc, self.lo, self.hi = desc, lo, hi

    def check(self, v: Any) -> str | None:
        if type(v) is not int:
            return f"must be {self.desc}, got {_show(v)}"
        if v < 0 <= self.lo:
            return f"is negative ({v}), expected a count in [{self.lo}, {self.hi}]"
        if not self.lo <= v <= self.hi:
            return f"is {v}, out of range [{self.lo}, {self.hi}]"
        return None


class _Time:
    """A finite number (booleans refused) of seconds (scale 1) or milliseconds (scale 1000)."""

    def __init__(self, desc: str, scale: float) -> None:
        self.desc, self.scale = desc, scale

    def check(self, v: Any) -> str | None:
        if type(v) not in (int, float):
            return f"must be {self.desc}, got {_show(v)}"
        if not (-MAX_ABS_TIME_S * self.scale <= v <= MAX_ABS_TIME_S * self.scale):  # also refuses NaN
            return f"is {_show(v)}, out of range (|t| <= {MAX_ABS_TIME_S * self.scale:g})"
        return None


class _Str:
    def check(self, v: Any) -> str | None:
        return None if type(v) is str else f"must be a string, got {_show(v)}"


class _List:
    def check(self, v: Any) -> str | None:
        return None if type(v) is list else f"must be a list of integers, got {_show(v)}"


_ID = _Int("an integer")
_TOKENS = _Int("an integer token count", 0, MAX_TOKENS)
_BAILIAN: dict[str, Any] = {
    "chat_id": _ID,
    "parent_chat_id": _Int("an integer (-1 for a root)"),
    "timestamp": _Time("a number of seconds", 1.0),
    "input_length": _TOKENS,
    "output_length": _TOKENS,
    "type": _Str(),
    "turn": _Int("an integer turn number", 0, MAX_TURN),
    "hash_ids": _List(),
}
_MOONCAKE: dict[str, Any] = {
    "timestamp": _Time("a number of milliseconds", 1000.0),
    "input_length": _TOKENS,
    "output_length": _TOKENS,
    "hash_ids": _List(),
}
_BAILIAN_ONLY = ("chat_id", "parent_chat_id", "type", "turn")
_FIX = "fix the line or pass --on-error skip to skip such lines"


def _show(v: Any) -> str:
    """A short, one-line rendering of a JSON value for messages."""
    return " ".join(repr(v).split())[:40]


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

    first_negative_line: int | None = None
    first_unsigned_line: int | None = None
    num_bytes_read: int = 0  # of the trace file so far (compressed bytes of .gz/.zst): the read's progress
    # called with num_bytes_read as the read advances (every BLOCK_BYTES of JSONL, every PROGRESS_LINES
    # Parquet rows), so a caller shows progress inside a chunk, which may hold a whole trace
    on_read: Callable[[int], None] | None = None

    def advanced(self, num_bytes_read: int) -> None:
        """The read reached NUM_BYTES_READ of the file."""
        self.num_bytes_read = num_bytes_read
        if self.on_read is not None:
            self.on_read(num_bytes_read)

    @property
    def id_domain(self) -> str:
        """'unsigned' when some block id is >= 2^63, else 'signed' (see ID_DOMAINS)."""
        return "unsigned" if self.first_unsigned_line is not None else "signed"

    def note_ids(self, path: Path, line_no: int, ids: npt.NDArray[Any]) -> None:
        """Track the id domain of the trace; a trace mixing negative ids and ids >= 2^63 is an error."""
        if ids.dtype == np.uint64:
            self.first_unsigned_line = self.first_unsigned_line or line_no
        elif self.first_negative_line is None and ids.shape[0] and int(ids.min()) < 0:
            self.first_negative_line = line_no
        if self.first_negative_line is not None and self.first_unsigned_line is not None:
            what = (f"has ids >= 2^63, but line {self.first_negative_line} has negative ids"
                    if line_no == self.first_unsigned_line
                    else f"has negative ids, but line {self.first_unsigned_line} has ids >= 2^63")
            raise located(path, line_no, "hash_ids", what, "a trace's ids must be all signed or all unsigned 64-bit")

    def note(self, kind: str, example: str) -> None:
        """Count one finding of KIND, keeping the first few examples."""
        self.skipped[kind] += 1
        ex = self.examples.setdefault(kind, [])
        if len(ex) < 5:
            ex.append(example)


def check_trace_path(path: Path) -> None:
    """Raise InputError unless PATH is a readable file."""
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a trace file; give the trace file itself")
    if not path.exists():
        raise InputError(f"{path}: no such file; check the trace path")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: not readable (permission denied); check the file's permissions")


def _zstd_blocks(f: IO[bytes], path: Path) -> Iterator[bytes]:
    """Decompressed bytes of every zstd frame in F; a frame cut short is an error, not the end."""
    import zstandard

    dctx = zstandard.ZstdDecompressor()
    dobj = dctx.decompressobj()
    pending = False  # a frame has started and not ended
    while True:
        data = f.read(1 << 20)
        if not data:
            break
        while data:
            out = dobj.decompress(data)
            pending = True
            if out:
                yield out
            if not dobj.eof:
                break
            data, pending = dobj.unused_data, False
            dobj = dctx.decompressobj()
    if pending:
        raise InputError(f"{path}: truncated .zst file (the last zstd frame is cut short); the file is damaged "
                         "or still being written: get a complete copy")


def byte_blocks(path: Path, stats: ReadStats | None = None) -> Iterator[bytes]:
    """The bytes of PATH, decompressed from .gz/.zst, without a leading UTF-8 byte-order mark, in blocks of
    about BLOCK_BYTES; a damaged or truncated compressed file is an InputError naming the file, never a
    shorter trace. STATS.num_bytes_read follows the bytes of the file consumed (reported after each block)."""
    check_trace_path(path)
    kind = path.suffix if path.suffix in (".gz", ".zst") else None
    try:
        with path.open("rb") as raw:
            if kind == ".gz":
                gz = gzip.GzipFile(fileobj=raw, mode="rb")
                blocks: Iterator[bytes] = iter(lambda: gz.read(BLOCK_BYTES), b"")
            elif kind == ".zst":
                blocks = _zstd_blocks(raw, path)
            else:
                blocks = iter(lambda: raw.read(BLOCK_BYTES), b"")
            first = True
            for block in blocks:
                if stats is not None:
                    stats.advanced(raw.tell())
                if first:
                    first = False
                    if block.startswith(UTF8_BOM):  # some editors write one; it is no part of the first record
                        block = block[len(UTF8_BOM):]
                yield block
            if stats is not None:
                stats.num_bytes_read = raw.tell()
    except InputError:
        raise
    except (EOFError, OSError, ValueError, zlib.error) as e:
        if kind is None:
            raise InputError(f"{path}: cannot read ({e}); check the file") from None
        what = "truncated" if isinstance(e, EOFError) else "damaged or not really"
        raise InputError(f"{path}: {what} {kind} file ({' '.join(str(e).split())[:120]}); get a complete "
                         f"copy, or rename it if it is not {kind}-compressed") from None
    except Exception as e:
        if type(e).__name__ != "ZstdError":
            raise
        raise InputError(f"{path}: damaged or not really .zst file ({e}); get a complete copy, or rename "
                         "it if it is not zstd-compressed") from None


def line_segments(path: Path, stats: ReadStats | None = None) -> Iterator[bytes]:
    """The bytes of PATH (as byte_blocks) cut after a newline: whole lines only, the last one perhaps
    without its newline. A line longer than a block is joined once, from its pieces."""
    pending: list[bytes] = []  # the start of a line not yet ended
    for block in byte_blocks(path, stats):
        cut = block.rfind(b"\n") + 1
        if not cut:
            pending.append(block)
            continue
        yield b"".join((*pending, block[:cut])) if pending else block[:cut]
        pending = [block[cut:]] if cut < len(block) else []
    if pending:
        yield b"".join(pending)


def iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line) of PATH, decompressed and checked as in byte_blocks."""
    line_no = 0
    for segment in line_segments(path):
        lines = segment.split(b"\n")
        last = lines.pop()  # empty when the segment ends with a newline
        for line in lines:
            line_no += 1
            yield line_no, line + b"\n"
        if last:
            yield line_no + 1, last


def _parquet_file(path: Path) -> pq.ParquetFile:
    check_trace_path(path)
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable Parquet file ({' '.join(str(e).split())[:120]}); is it "
                         "truncated, or another format? (pass --format bailian/mooncake for JSONL)") from None


def detect_format(path: Path) -> str:
    """The trace format of PATH from its first record (bailian, mooncake or parquet)."""
    check_trace_path(path)
    with path.open("rb") as f:
        if f.read(4) == b"PAR1":
            return "parquet"
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
        if "chat_id" in rec:
            return "bailian"
        if "hash_ids" in rec and "timestamp" in rec:
            return "mooncake"
        raise located(path, line_no, None, f"unknown record with fields {_show(sorted(rec)[:8])}",
                      "expected Bailian (chat_id, hash_ids, ...) or Mooncake (timestamp, hash_ids, ...) JSONL")
    raise InputError(f"{path}: the file is empty (no records); give a trace with at least one request")


def _hash_array(path: Path, line_no: int, hashes: list[Any]) -> npt.NDArray[np.int64] | npt.NDArray[np.uint64]:
    """HASHES as int64 (every id fits) or uint64 (some id >= 2^63); anything else is an InputError."""
    if not hashes:
        return np.zeros(0, dtype=np.int64)
    if set(map(type, hashes)) != {int}:
        bad = next(h for h in hashes if type(h) is not int)
        raise located(path, line_no, "hash_ids", f"must be a list of integers (flat), found {_show(bad)}", _FIX)
    try:
        return np.array(hashes, dtype=np.int64)
    except OverflowError:
        pass
    try:
        return np.array(hashes, dtype=np.uint64)
    except OverflowError:
        lo, hi = min(hashes), max(hashes)
        what = (f"mixes a negative id ({lo}) with an id >= 2^63 ({hi})" if lo < 0 and hi >= 1 << 63
                else f"has an id outside 64 bits ({lo if lo < INT64[0] else hi})")
        raise located(path, line_no, "hash_ids", what, "ids are signed or unsigned 64-bit integers") from None


def _check_record(path: Path, line_no: int, rec: Any, spec: dict[str, Any]
                  ) -> npt.NDArray[np.int64] | npt.NDArray[np.uint64]:
    """Validate one decoded record (types, ranges, the other format's fields); return its hash ids."""
    if not isinstance(rec, dict):
        raise located(path, line_no, None, "the line is not a JSON object", _FIX)
    for name, check in spec.items():
        if name not in rec:
            raise located(path, line_no, name, "is missing", _FIX)
        what = check.check(rec[name])
        if what is not None:
            raise located(path, line_no, name, what, _FIX)
    return _hash_array(path, line_no, rec["hash_ids"])


def _loads(path: Path, line_no: int, line: bytes) -> Any:
    """Decode one JSONL line (orjson; the standard library for what orjson refuses but is still JSON-ish,
    e.g. integers beyond 64 bits or NaN, so that the field check names the field and its range)."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as e:
        try:
            return json.loads(line)
        except (ValueError, RecursionError):
            raise located(path, line_no, None, f"malformed JSON ({e})", _FIX) from None


def _mixed_format(path: Path, line_no: int, rec: Any, bailian: bool, fmt_line: int) -> InputError | None:
    """The error for a record of the other format (mixed formats are never skipped: the file is wrong)."""
    if not isinstance(rec, dict):
        return None
    if not bailian and any(k in rec for k in _BAILIAN_ONLY):
        k = next(k for k in _BAILIAN_ONLY if k in rec)
        return located(path, line_no, k, f"belongs to a Bailian record, but line {fmt_line} made this a "
                       "Mooncake trace", "one file holds one format: split the file")
    if bailian and "chat_id" not in rec and "timestamp" in rec and "hash_ids" in rec \
            and not any(k in rec for k in _BAILIAN_ONLY):
        return located(path, line_no, "chat_id", f"is missing: a Mooncake record, but line {fmt_line} made "
                       "this a Bailian trace", "one file holds one format: split the file")
    return None


class _ChunkBuilder:
    """The requests of one chunk as they are read. Each record's hash ids (a list of integers only, see add)
    become an int64 array at once, so no Python int outlives its line; a record with an id outside int64
    goes through the precise checks of _hash_array, which name the line. Negative ids are noted for the id
    domain (ReadStats.note_ids) in file order, when the pending records are settled."""

    def __init__(self, path: Path, on_error: str, stats: ReadStats) -> None:
        self.path, self.on_error, self.stats = path, on_error, stats
        self.cols: dict[str, list[Any]] = {k: [] for k in ("line_no", "chat_id", "parent", "ts", "inp", "out",
                                                            "type", "turn", "user")}
        self.parts: list[npt.NDArray[np.int64]] = []    # hash ids of the settled records, in order
        self.pending: list[npt.NDArray[np.int64]] = []  # hash ids of the later records (one or more each)
        self.pending_from = 0                           # the index of the first of these records
        self.lengths: list[int] = []                    # hash ids per record
        self.num_refs = 0                               # their sum
        self.strings: dict[bytes, str] = {}             # the text of the scanned strings seen so far

    def __len__(self) -> int:
        return len(self.lengths)

    def add(self, line_no: int, rec: dict[str, Any], bailian: bool, hashes: list[int]) -> None:
        """Append a record whose fields are valid and whose HASHES list holds integers only (their range not
        yet checked); an id beyond 64 bits or a mix of domains raises (with --on-error skip, the record is
        counted and dropped)."""
        try:
            ids = np.fromiter(hashes, np.int64, len(hashes))  # exact: integers only
            if not self.pending:
                self.pending_from = len(self)
            self.pending.append(ids)
        except OverflowError:
            self.settle()  # the id domain of the earlier records is noted first
            try:
                wide = _hash_array(self.path, line_no, hashes)  # uint64, or an error naming the line
            except InputError as e:
                _skip_or_raise(e, self.on_error, self.stats)
                return
            self.stats.note_ids(self.path, line_no, wide)  # mixed id domains: never skipped, the file is wrong
            self.parts.append(wide.view(np.int64))
        c = self.cols
        c["line_no"].append(line_no)
        c["ts"].append(rec["timestamp"] if bailian else rec["timestamp"] / 1000.0)
        c["inp"].append(rec["input_length"])
        c["out"].append(rec["output_length"])
        if bailian:
            uid = rec.get("user_id")
            c["chat_id"].append(rec["chat_id"])
            c["parent"].append(rec["parent_chat_id"])
            c["type"].append(rec["type"])
            c["turn"].append(rec["turn"])
            c["user"].append(None if uid is None else str(uid))
        else:
            c["chat_id"].append(-1)  # assigned from the arrival order later
            c["parent"].append(-1)
            c["type"].append(None)
            c["turn"].append(None)
            c["user"].append(None)
        self.lengths.append(len(hashes))
        self.num_refs += len(hashes)

    def add_scanned(self, seg: bytes, line0: int, rec: npt.NDArray[np.int64], ts: npt.NDArray[np.float64],
                    ids: npt.NDArray[np.int64], bailian: bool) -> None:
        """Append the records that trace/jsonl_scan.scan parsed from SEG after its line LINE0: its REC rows,
        TS and IDS (signed 64-bit, every check done but the id domain's, noted when settled)."""
        from tongyi_trace.trace import jsonl_scan as js

        n = rec.shape[0]
        if not self.pending:
            self.pending_from = len(self)
        self.pending.append(ids.copy())
        c = self.cols
        c["line_no"].extend((rec[:, js.LINE] + (line0 + 1)).tolist())
        c["ts"].extend(ts.tolist())
        c["inp"].extend(rec[:, js.INPUT].tolist())
        c["out"].extend(rec[:, js.OUTPUT].tolist())
        if bailian:
            c["chat_id"].extend(rec[:, js.CHAT].tolist())
            c["parent"].extend(rec[:, js.PARENT].tolist())
            c["turn"].extend(rec[:, js.TURN].tolist())
            c["type"].extend(self._texts(seg, rec[:, js.TYPE_START], rec[:, js.TYPE_END]))
            users: list[str | None] = [None] * n
            kinds = rec[:, js.USER_KIND]
            for i in np.flatnonzero(kinds == js.USER_STR).tolist():
                users[i] = self._text(seg, int(rec[i, js.USER_START]), int(rec[i, js.USER_END]))
            for i in np.flatnonzero(kinds == js.USER_INT).tolist():
                users[i] = str(int(seg[rec[i, js.USER_START]:rec[i, js.USER_END]]))
            c["user"].extend(users)
        else:
            for k in ("chat_id", "parent"):
                c[k].extend([-1] * n)  # assigned from the arrival order later
            for k in ("type", "turn", "user"):
                c[k].extend([None] * n)
        lengths = rec[:, js.NUM_IDS]
        self.lengths.extend(lengths.tolist())
        self.num_refs += int(lengths.sum())

    def _text(self, seg: bytes, start: int, end: int) -> str:
        """SEG[START:END] as text (printable ASCII: the scan checked), one str per distinct string."""
        b = seg[start:end]
        t = self.strings.get(b)
        if t is None:
            t = self.strings[b] = b.decode("ascii")
        return t

    def _texts(self, seg: bytes, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]) -> list[str]:
        return [self._text(seg, s, e) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]

    def settle(self) -> None:
        """Join the pending records' ids into one part, noting the first of them with a negative id."""
        if not self.pending:
            return
        arr = self.pending[0] if len(self.pending) == 1 else np.concatenate(self.pending)
        first = self.pending_from
        if self.stats.first_negative_line is None:
            neg = np.flatnonzero(arr < 0)
            if neg.shape[0]:
                ends = np.cumsum(np.asarray(self.lengths[first:], dtype=np.int64))
                r = int(np.searchsorted(ends, neg[0], side="right"))
                start = int(ends[r] - self.lengths[first + r])
                self.stats.note_ids(self.path, self.cols["line_no"][first + r],
                                    arr[start:start + self.lengths[first + r]])
        self.parts.append(arr)
        self.pending, self.pending_from = [], len(self)

    def build(self) -> Chunk:
        """The chunk."""
        self.settle()
        offsets = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(np.asarray(self.lengths, dtype=np.int64), out=offsets[1:])
        parts = self.parts
        flat = (parts[0] if len(parts) == 1 else np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
        c = self.cols
        return Chunk(
            line_no=np.asarray(c["line_no"], dtype=np.int64),
            chat_id=np.asarray(c["chat_id"], dtype=np.int64),
            parent_chat_id=np.asarray(c["parent"], dtype=np.int64),
            timestamp_s=np.asarray(c["ts"], dtype=np.float64),
            input_tokens=np.asarray(c["inp"], dtype=np.int64),
            output_tokens=np.asarray(c["out"], dtype=np.int64),
            type=c["type"], turn=c["turn"], user_id=c["user"],
            hash_ids=flat, offsets=offsets,
        )


def _skip_or_raise(e: InputError, on_error: str, stats: ReadStats) -> None:
    """--on-error skip: count the bad line; fail: raise its error."""
    if on_error != "skip":
        raise e
    stats.note("skipped_lines", str(e))


_INT_TYPES = {int}
_BLANKS = b" \t\r\n"
_INT_LIST_CHARS = b"0123456789-," + _BLANKS


def _int_text(line: bytes) -> bool:
    """True when LINE's hash_ids list certainly holds integers only: the key appears once, a '[' follows it
    (after the colon), and the text from there to the first ']' holds nothing but digits, signs, commas and
    blanks. (The line is valid JSON, so that text is a flat list of integer literals.)"""
    i = line.find(b'"hash_ids"')
    k = line.find(b"[", i)
    j = line.find(b"]", k)
    return (i >= 0 <= k < j and line[i + 10:k].translate(None, _BLANKS) == b":"
            and not line[k + 1:j].translate(None, _INT_LIST_CHARS) and line.find(b'"hash_ids"', j) < 0)


def _quick_ok(rec: Any, bailian: bool, line: bytes) -> bool:
    """True when REC (decoded from LINE) certainly passes _check_record and _mixed_format except for the
    range of the ids in hash_ids (checked per chunk, see _ChunkBuilder), which are integers; anything else
    goes through the precise checks, which name the problem."""
    if type(rec) is not dict or (not bailian and any(k in rec for k in _BAILIAN_ONLY)):
        return False
    try:
        ts, inp, out, hashes = rec["timestamp"], rec["input_length"], rec["output_length"], rec["hash_ids"]
        if bailian:
            cid, par, typ, turn = rec["chat_id"], rec["parent_chat_id"], rec["type"], rec["turn"]
    except KeyError:
        return False
    lim = MAX_ABS_TIME_S if bailian else MAX_ABS_TIME_S * 1000.0
    if not (type(inp) is int and type(out) is int and (type(ts) is float or type(ts) is int)
            and 0 <= inp <= MAX_TOKENS and 0 <= out <= MAX_TOKENS and -lim <= ts <= lim
            and type(hashes) is list and (_int_text(line) or set(map(type, hashes)) <= _INT_TYPES)):
        return False
    if not bailian:
        return True
    uid = rec.get("user_id")
    return (type(cid) is int and type(par) is int and type(turn) is int and type(typ) is str
            and INT64[0] <= cid <= INT64[1] and INT64[0] <= par <= INT64[1] and 0 <= turn <= MAX_TURN
            and (uid is None or type(uid) is str or type(uid) is int))


class _JsonlReader:
    """Chunks of a JSONL trace: records of the usual shape through the compiled scan (trace/jsonl_scan.py),
    every other line through the precise checks of `line`, in file order."""

    def __init__(self, path: Path, fmt: str, on_error: str, stats: ReadStats) -> None:
        self.path, self.on_error, self.stats = path, on_error, stats
        self.spec = _BAILIAN if fmt == "bailian" else _MOONCAKE
        self.bailian = fmt == "bailian"
        self.first_line = 0  # the first line that is not blank: its format is the trace's
        self.chunk = _ChunkBuilder(path, on_error, stats)

    def line(self, line_no: int, line: bytes) -> None:
        """Read one line with the precise checks: a record is added, a blank line counted, a bad line raises
        (or, with --on-error skip, is counted and dropped)."""
        path, bailian, on_error, stats, c = self.path, self.bailian, self.on_error, self.stats, self.chunk
        stats.num_lines += 1
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            if not line.strip():
                stats.num_blank += 1
                return
            rec = None
        self.first_line = self.first_line or line_no
        if _quick_ok(rec, bailian, line):
            c.add(line_no, rec, bailian, rec["hash_ids"])
            return
        c.settle()  # the id domain of the earlier lines is noted first
        try:
            rec = _loads(path, line_no, line) if rec is None else rec
        except InputError as e:
            _skip_or_raise(e, on_error, stats)
            return
        mixed = _mixed_format(path, line_no, rec, bailian, self.first_line)
        if mixed is not None:
            raise mixed  # never skipped: the file is wrong, not a line
        try:
            _check_record(path, line_no, rec, self.spec)
            uid = rec.get("user_id") if bailian else None
            if uid is not None and type(uid) not in (str, int):
                raise located(path, line_no, "user_id", f"must be a string or integer, got {_show(uid)}", _FIX)
        except InputError as e:
            _skip_or_raise(e, on_error, stats)
            return
        c.add(line_no, rec, bailian, rec["hash_ids"])

    def full(self) -> bool:
        return len(self.chunk) >= CHUNK_LINES or self.chunk.num_refs >= CHUNK_REFS

    def take(self) -> Iterator[Chunk]:
        """The chunk read so far (unless it holds no request), a new one started."""
        c, self.chunk = self.chunk, _ChunkBuilder(self.path, self.on_error, self.stats)
        if len(c):
            yield c.build()

    def chunks(self) -> Iterator[Chunk]:
        from tongyi_trace.trace import jsonl_scan as js  # compiled: loaded for a JSONL trace only

        rec = np.zeros((_SCAN_RECORDS, js.REC_COLS), dtype=np.int64)
        ts = np.zeros(_SCAN_RECORDS, dtype=np.float64)
        ids = np.zeros(2 * _SCAN_IDS, dtype=np.int64)  # a record crossing _SCAN_IDS has room for as many more
        lim_ts = MAX_ABS_TIME_S if self.bailian else MAX_ABS_TIME_S * 1000.0
        line_no = 0  # lines read so far
        for seg in line_segments(self.path, self.stats):
            buf = np.frombuffer(seg, dtype=np.uint8)
            pos = 0
            while pos < len(seg):
                c = self.chunk
                pos, lines, n, n_ids, status = js.scan(
                    buf, pos, len(seg), self.bailian, min(_SCAN_RECORDS, CHUNK_LINES - len(c)),
                    min(_SCAN_IDS, CHUNK_REFS - c.num_refs), rec, ts, ids, lim_ts, MAX_TOKENS, MAX_TURN)
                if n:
                    c.add_scanned(seg, line_no, rec[:n], ts[:n], ids[:n_ids], self.bailian)
                    self.first_line = self.first_line or line_no + 1 + int(rec[0, js.LINE])
                self.stats.num_lines += lines
                self.stats.num_blank += lines - n
                line_no += lines
                if status == js.SLOW:
                    end = seg.find(b"\n", pos) + 1 or len(seg)
                    line_no += 1
                    self.line(line_no, seg[pos:end])
                    pos = end
                if self.full():
                    yield from self.take()
        yield from self.take()


_SCAN_RECORDS = 1 << 13  # records per call of the compiled scan (its scratch rows)
_SCAN_IDS = 1 << 17      # hash ids per call, about


def _read_jsonl(path: Path, fmt: str, on_error: str, stats: ReadStats) -> Iterator[Chunk]:
    return _JsonlReader(path, fmt, on_error, stats).chunks()


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


def _read_parquet(path: Path, stats: ReadStats) -> Iterator[Chunk]:
    pf = _parquet_file(path)
    schema = pf.schema_arrow
    missing = [c for c in _PARQUET_COLUMNS if c not in schema.names]
    if missing:
        raise InputError(f"{path}: column '{missing[0]}' is missing; a Parquet trace needs the columns "
                         f"{', '.join(_PARQUET_COLUMNS)} (write one with 'kvtrace export')")
    cols = [*_PARQUET_COLUMNS, *(["user_id"] if "user_id" in schema.names else [])]
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
        raise InputError(f"{path}: unreadable Parquet data after row {row0} ({' '.join(str(e).split())[:120]}); "
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


def default_block_size(path: Path, fmt: str) -> int:
    """Tokens per hash id: the format's default, or what a kvtrace Parquet trace records."""
    if fmt == "parquet":
        meta = _parquet_file(path).schema_arrow.metadata or {}
        if PARQUET_BLOCK_SIZE_KEY in meta:
            raw = meta[PARQUET_BLOCK_SIZE_KEY]
            try:
                value = int(raw)
            except ValueError:
                value = 0
            if not 1 <= value <= MAX_BLOCK_SIZE:
                raise InputError(f"{path}: metadata '{PARQUET_BLOCK_SIZE_KEY.decode()}' is {_show(raw)}, not a "
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


def read_chunks(path: Path, fmt: str, on_error: str, stats: ReadStats) -> Iterator[Chunk]:
    """Parse PATH of format FMT chunk by chunk; ON_ERROR 'fail' raises on a bad line, 'skip' counts it."""
    check_options(fmt, on_error, None)
    if fmt == "parquet":
        return _read_parquet(path, stats)
    check_trace_path(path)
    with path.open("rb") as f:
        if f.read(4) == b"PAR1":
            raise InputError(f"{path}: a Parquet file read as {fmt} JSONL; drop --format {fmt} or pass "
                             "--format parquet")
    return _read_jsonl(path, fmt, on_error, stats)
