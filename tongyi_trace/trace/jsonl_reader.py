"""Chunks of a JSONL trace, read in blocks of bytes: a compiled scan (trace/jsonl_scan.py) parses the records
of the usual shape straight into columns and leaves every other line to the precise per-line checks of
trace/records.py (`JsonlReader.line`), which accept it or name its problem; tests/trace/test_jsonl_scan.py
holds the two paths to the same chunks, statistics and errors."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from tongyi_trace.errors import InputError, located
from tongyi_trace.trace.records import (
    BAILIAN_SPEC,
    CHUNK_LINES,
    CHUNK_REFS,
    FIX,
    MAX_ABS_TIME_S,
    MAX_TOKENS,
    MAX_TURN,
    MOONCAKE_SPEC,
    Chunk,
    ReadStats,
    check_record,
    hash_array,
    mixed_format,
    quick_ok,
    show,
    skip_or_raise,
)
from tongyi_trace.trace.source import line_segments


def _loads(path: Path, line_no: int, line: bytes) -> Any:
    """Decode one JSONL line (orjson; the standard library for what orjson refuses but is still JSON-ish,
    e.g. integers beyond 64 bits or NaN, so that the field check names the field and its range)."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as e:
        try:
            return json.loads(line)
        except (ValueError, RecursionError):
            raise located(path, line_no, None, f"malformed JSON ({e})", FIX) from None


_KEY_END = re.compile(rb'"\s*:')  # the end of a key: at least once per key of the line (also in strings)


def repeated_key(line: bytes, rec: Any) -> str | None:
    """The first key that a JSON object of LINE (decoded: REC) names twice, or None. JSON readers keep the
    last value, silently; kvtrace counts the line as a finding (duplicate_keys). Cheap when there is none: the
    key ends in the text bound the number of keys, so a flat object with as many keys as that is settled."""
    if not isinstance(rec, dict) or len(_KEY_END.findall(line)) <= len(rec):
        return None
    found: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in items]
        if not found and len(set(keys)) < len(keys):
            found.append(next(k for i, k in enumerate(keys) if k in keys[:i]))
        return dict(items)

    try:
        json.loads(line, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    return found[0] if found else None


def note_repeated_key(stats: ReadStats, path: Path, line_no: int, line: bytes, rec: Any) -> None:
    """Count in STATS a record (LINE, decoded: REC) that names a key twice: finding duplicate_keys (the
    compiled scan leaves such lines to the precise path)."""
    key = repeated_key(line, rec)
    if key is not None:
        stats.note("duplicate_keys", f"{path}:{line_no}: names the key {key!r} twice; the last value is used (as "
                                     "every JSON reader does): fix the line that wrote it")


class ChunkBuilder:
    """The requests of one chunk as they are read. Each record's hash ids (a list of integers only, see add)
    become an int64 array at once, so no Python int outlives its line; a record with an id outside int64
    goes through the precise checks of hash_array, which name the line. Negative ids are noted for the id
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
                wide = hash_array(self.path, line_no, hashes)  # uint64, or an error naming the line
            except InputError as e:
                skip_or_raise(e, self.on_error, self.stats)
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


class JsonlReader:
    """Chunks of a JSONL trace: records of the usual shape through the compiled scan (trace/jsonl_scan.py),
    every other line through the precise checks of `line`, in file order."""

    def __init__(self, path: Path, fmt: str, on_error: str, stats: ReadStats) -> None:
        self.path, self.on_error, self.stats = path, on_error, stats
        self.spec = BAILIAN_SPEC if fmt == "bailian" else MOONCAKE_SPEC
        self.bailian = fmt == "bailian"
        self.first_line = 0  # the first line that is not blank: its format is the trace's
        self.chunk = ChunkBuilder(path, on_error, stats)

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
        if quick_ok(rec, self.spec, bailian, line):
            self._note_repeated_key(line_no, line, rec)
            c.add(line_no, rec, bailian, rec["hash_ids"])
            return
        c.settle()  # the id domain of the earlier lines is noted first
        try:
            rec = _loads(path, line_no, line) if rec is None else rec
        except InputError as e:
            skip_or_raise(e, on_error, stats)
            return
        mixed = mixed_format(path, line_no, rec, bailian, self.first_line)
        if mixed is not None:
            raise mixed  # never skipped: the file is wrong, not a line
        try:
            check_record(path, line_no, rec, self.spec)
            uid = rec.get("user_id") if bailian else None
            if uid is not None and type(uid) not in (str, int):
                raise located(path, line_no, "user_id", f"must be a string or integer, got {show(uid)}", FIX)
        except InputError as e:
            skip_or_raise(e, on_error, stats)
            return
        self._note_repeated_key(line_no, line, rec)
        c.add(line_no, rec, bailian, rec["hash_ids"])

    def _note_repeated_key(self, line_no: int, line: bytes, rec: dict[str, Any]) -> None:
        note_repeated_key(self.stats, self.path, line_no, line, rec)

    def full(self) -> bool:
        return len(self.chunk) >= CHUNK_LINES or self.chunk.num_refs >= CHUNK_REFS

    def take(self) -> Iterator[Chunk]:
        """The chunk read so far (unless it holds no request), a new one started."""
        c, self.chunk = self.chunk, ChunkBuilder(self.path, self.on_error, self.stats)
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


def read_jsonl(path: Path, fmt: str, on_error: str, stats: ReadStats) -> Iterator[Chunk]:
    return JsonlReader(path, fmt, on_error, stats).chunks()
