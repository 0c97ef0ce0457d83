"""A trace's records and their checks, written once: the ranges every later stage relies on, the field
specifications of the Bailian and Mooncake records (`check_record`, with `quick_ok` the same checks
without messages, for the JSONL reader's common case), the 64-bit id domain (`ReadStats.note_ids`),
and `Chunk`, the columns the JSONL and Parquet readers hand to ingest. Formats: paper-notes "The traces"."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tongyi_trace.errors import InputError, brief, located

CHUNK_LINES = 1 << 18
# hash ids per chunk (8 bytes each): small enough that a chunk's arrays are reused by the allocator instead of
# being mapped afresh (first-touch page faults cost more than the work on a large temporary); ingest's
# numbering (trace/dense.ChainNumbers) carries over from chunk to chunk
CHUNK_REFS = 1 << 20
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

    def ok(self, v: Any) -> bool:
        """Whether V passes (check's test without its message)."""
        return type(v) is int and self.lo <= v <= self.hi

    def check(self, v: Any) -> str | None:
        """None when V passes, else what is wrong with it."""
        if self.ok(v):
            return None
        if type(v) is not int:
            return f"must be {self.desc}, got {show(v)}"
        if v < 0 <= self.lo:
            return f"is negative ({v}), expected a count in [{self.lo}, {self.hi}]"
        if not self.lo <= v <= self.hi:
            return f"is {v}, out of range [{self.lo}, {self.hi}]"
        return None


class _Time:
    """A finite number (booleans refused) of seconds (scale 1) or milliseconds (scale 1000)."""

    def __init__(self, desc: str, scale: float) -> None:
        self.desc, self.scale = desc, scale
        self.lim = MAX_ABS_TIME_S * scale

    def ok(self, v: Any) -> bool:
        """Whether V passes (check's test without its message; NaN fails)."""
        return (type(v) is float or type(v) is int) and -self.lim <= v <= self.lim

    def check(self, v: Any) -> str | None:
        """None when V passes, else what is wrong with it."""
        if self.ok(v):
            return None
        if type(v) not in (int, float):
            return f"must be {self.desc}, got {show(v)}"
        if not (-MAX_ABS_TIME_S * self.scale <= v <= MAX_ABS_TIME_S * self.scale):  # also refuses NaN
            return f"is {show(v)}, out of range (|t| <= {MAX_ABS_TIME_S * self.scale:g})"
        return None


class _Str:
    def ok(self, v: Any) -> bool:
        return type(v) is str

    def check(self, v: Any) -> str | None:
        return None if self.ok(v) else f"must be a string, got {show(v)}"


class _List:
    def ok(self, v: Any) -> bool:
        return type(v) is list

    def check(self, v: Any) -> str | None:
        return None if self.ok(v) else f"must be a list of integers, got {show(v)}"


_ID = _Int("an integer")
_TOKENS = _Int("an integer token count", 0, MAX_TOKENS)
BAILIAN_SPEC: dict[str, Any] = {
    "chat_id": _ID,
    "parent_chat_id": _Int("an integer (-1 for a root)"),
    "timestamp": _Time("a number of seconds", 1.0),
    "input_length": _TOKENS,
    "output_length": _TOKENS,
    "type": _Str(),
    "turn": _Int("an integer turn number", 0, MAX_TURN),
    "hash_ids": _List(),
}
MOONCAKE_SPEC: dict[str, Any] = {
    "timestamp": _Time("a number of milliseconds", 1000.0),
    "input_length": _TOKENS,
    "output_length": _TOKENS,
    "hash_ids": _List(),
}
# AIPerf's mooncake_trace (trace/aiperf_reader.py): the Mooncake fields, timestamp optional (or delay)
AIPERF_SPEC: dict[str, Any] = {k: MOONCAKE_SPEC[k] for k in ("input_length", "output_length", "hash_ids")}
BAILIAN_ONLY = ("chat_id", "parent_chat_id", "type", "turn")
FIX = "fix the line or pass --on-error skip to skip such lines"


def show(v: Any, width: int = 40) -> str:
    """A short, one-line rendering of a JSON value for messages (errors.brief: never cut mid-word)."""
    return brief(repr(v), width)


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


def hash_array(path: Path, line_no: int, hashes: list[Any]) -> npt.NDArray[np.int64] | npt.NDArray[np.uint64]:
    """HASHES as int64 (every id fits) or uint64 (some id >= 2^63); anything else is an InputError."""
    if not hashes:
        return np.zeros(0, dtype=np.int64)
    if set(map(type, hashes)) != {int}:
        bad = next(h for h in hashes if type(h) is not int)
        # an integer too large for 64 bits (2^64) reaches here as the float the JSON parser made of it
        if type(bad) is float and math.isfinite(bad) and bad == int(bad) and abs(bad) >= 2**63:
            raise located(path, line_no, "hash_ids", f"holds the id {int(bad)}, out of range: ids are 64-bit "
                          "(-2^63 .. 2^64 - 1)", FIX)
        raise located(path, line_no, "hash_ids", f"must be a list of integers (flat), found {show(bad)}", FIX)
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


def check_record(path: Path, line_no: int, rec: Any, spec: dict[str, Any]
                  ) -> npt.NDArray[np.int64] | npt.NDArray[np.uint64]:
    """Validate one decoded record (types, ranges, the other format's fields); return its hash ids."""
    if not isinstance(rec, dict):
        raise located(path, line_no, None, "the line is not a JSON object", FIX)
    for name, check in spec.items():
        if name not in rec:
            raise located(path, line_no, name, "is missing", FIX)
        what = check.check(rec[name])
        if what is not None:
            raise located(path, line_no, name, what, FIX)
    return hash_array(path, line_no, rec["hash_ids"])


def mixed_format(path: Path, line_no: int, rec: Any, bailian: bool, fmt_line: int) -> InputError | None:
    """The error for a record of the other format (mixed formats are never skipped: the file is wrong)."""
    if not isinstance(rec, dict):
        return None
    if not bailian and any(k in rec for k in BAILIAN_ONLY):
        k = next(k for k in BAILIAN_ONLY if k in rec)
        return located(path, line_no, k, f"belongs to a Bailian record, but line {fmt_line} made this a "
                       "Mooncake trace", "one file holds one format: split the file")
    if bailian and "chat_id" not in rec and "timestamp" in rec and "hash_ids" in rec \
            and not any(k in rec for k in BAILIAN_ONLY):
        return located(path, line_no, "chat_id", f"is missing: a Mooncake record, but line {fmt_line} made "
                       "this a Bailian trace", "one file holds one format: split the file")
    return None


def skip_or_raise(e: InputError, on_error: str, stats: ReadStats) -> None:
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


def quick_ok(rec: Any, spec: dict[str, Any], bailian: bool, line: bytes) -> bool:
    """True when REC (decoded from LINE) certainly passes check_record and mixed_format except for the
    range of the ids in hash_ids (checked per chunk, see jsonl_reader.ChunkBuilder), which are integers:
    the same field checks (SPEC's `ok`), without their messages; anything else goes through the precise
    checks, which name the problem."""
    if type(rec) is not dict or (not bailian and any(k in rec for k in BAILIAN_ONLY)):
        return False
    for name, check in spec.items():
        v = rec.get(name, _MISSING)
        if v is _MISSING or not check.ok(v):
            return False
    if not (_int_text(line) or set(map(type, rec["hash_ids"])) <= _INT_TYPES):
        return False
    uid = rec.get("user_id") if bailian else None
    return uid is None or type(uid) is str or type(uid) is int


_MISSING = object()
