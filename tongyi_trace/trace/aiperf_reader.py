"""Chunks of an AIPerf trace: the Mooncake fields (input_length, output_length, hash_ids) with AIPerf's
multi-turn fields, as AIPerf's `mooncake_trace` custom dataset defines them:

- `session_id` (string or integer, optional): the conversation the line is a turn of; the lines of one
  session are its turns in file order. A line without one is a conversation of its own.
- `timestamp` (ms, optional): the request's arrival on the trace's clock.
- `delay` (ms, optional): the wait before the turn is sent, after the previous turn of its session.
  AIPerf counts it from the previous turn's answer; the trace does not hold how long answers took, so
  kvtrace counts it from the previous turn's arrival (a lower bound of the real gap). A session's first
  turn with a delay arrives DELAY after the trace's start (0).
- neither: a first turn arrives at 0, a later turn with its previous turn.
A line with both `timestamp` and `delay` is refused (AIPerf refuses it too); `text_input` lines (text
instead of lengths and hash ids) carry no block ids and are refused with what to do.

Sessions are given, not inferred: chat_id is the line's index among the records, parent_chat_id the
previous turn's, turn its position in the session (1 = first). Requests are then sorted by arrival as for
any trace (the file lists sessions, not arrivals). Every line goes through the precise checks of
trace/records.py (the compiled scan reads the Bailian and Mooncake shapes only); AIPerf traces are small.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from tongyi_trace.errors import InputError, located
from tongyi_trace.trace.jsonl_reader import ChunkBuilder, note_repeated_key
from tongyi_trace.trace.records import (
    AIPERF_SPEC,
    BAILIAN_ONLY,
    CHUNK_LINES,
    CHUNK_REFS,
    FIX,
    MAX_ABS_TIME_S,
    MOONCAKE_SPEC,
    Chunk,
    ReadStats,
    check_record,
    show,
    skip_or_raise,
)
from tongyi_trace.trace.source import line_segments

_MS = 1000.0


class AiperfReader:
    """The records of an AIPerf trace in file order, each with its chat id, parent, turn and arrival."""

    def __init__(self, path: Path, on_error: str, stats: ReadStats) -> None:
        self.path, self.on_error, self.stats = path, on_error, stats
        self.num_records = 0
        # per session id: (chat id, arrival in ms, turn) of its latest turn so far
        self.sessions: dict[Any, tuple[int, float, int]] = {}
        self.chunk = ChunkBuilder(path, on_error, stats)
        self.raw: Any = None  # the last line as decoded

    def line(self, line_no: int, line: bytes) -> None:
        """Check one line and add its record (a blank line is counted; a bad line raises or is skipped)."""
        self.stats.num_lines += 1
        if not line.strip():
            self.stats.num_blank += 1
            return
        try:
            rec = self._record(line_no, line)
        except InputError as e:
            skip_or_raise(e, self.on_error, self.stats)
            return
        note_repeated_key(self.stats, self.path, line_no, line, self.raw)
        self.chunk.add(line_no, rec, True, rec["hash_ids"])
        self.num_records += 1

    def _record(self, line_no: int, line: bytes) -> dict[str, Any]:
        """The line as a Bailian-shaped record (chat_id, parent_chat_id, turn, timestamp in s), or an
        InputError naming the line and field."""
        path = self.path
        try:
            rec = self.raw = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise located(path, line_no, None, f"malformed JSON ({e})", FIX) from None
        if isinstance(rec, dict) and "text_input" in rec and "hash_ids" not in rec:
            raise located(path, line_no, "text_input", "is text without hash_ids: kvtrace needs the block hashes",
                          "give input_length and hash_ids instead of text_input (or skip such lines with "
                          "--on-error skip)")
        if isinstance(rec, dict) and any(k in rec for k in BAILIAN_ONLY):
            k = next(k for k in BAILIAN_ONLY if k in rec)
            raise located(path, line_no, k, "belongs to a Bailian record, but this is an AIPerf trace",
                          "one file holds one format: split the file")
        check_record(path, line_no, rec, AIPERF_SPEC)
        for name in ("timestamp", "delay"):
            if name in rec:
                what = _MS_TIME.check(rec[name])
                if what is None and name == "delay" and rec[name] < 0:
                    what = f"is negative ({rec[name]}), expected milliseconds >= 0"
                if what is not None:
                    raise located(path, line_no, name, what, FIX)
        if "timestamp" in rec and "delay" in rec:
            raise located(path, line_no, "delay", "is given with a timestamp", "give one of timestamp (ms on the "
                          "trace's clock) or delay (ms after the previous turn of the session)")
        sid = rec.get("session_id")
        if sid is not None and (type(sid) is not str and type(sid) is not int):
            raise located(path, line_no, "session_id", f"must be a string or integer, got {show(sid)}", FIX)
        prev = self.sessions.get(sid) if sid is not None else None
        if "timestamp" in rec:
            arrival_ms = float(rec["timestamp"])
        else:
            arrival_ms = (prev[1] if prev else 0.0) + rec.get("delay", 0)
            if abs(arrival_ms) > MAX_ABS_TIME_S * _MS:
                raise located(path, line_no, "delay", f"takes the session to {arrival_ms / _MS:.3g} s, out of "
                              f"range (|t| <= {MAX_ABS_TIME_S:g} s)", FIX)
        chat_id = self.num_records
        if sid is not None:
            self.sessions[sid] = (chat_id, arrival_ms, prev[2] + 1 if prev else 1)
        return {"chat_id": chat_id, "parent_chat_id": prev[0] if prev else -1, "timestamp": arrival_ms / _MS,
                "input_length": rec["input_length"], "output_length": rec["output_length"], "type": None,
                "turn": prev[2] + 1 if prev else 1, "hash_ids": rec["hash_ids"]}

    def chunks(self) -> Iterator[Chunk]:
        """The records, a chunk at a time (CHUNK_LINES records or CHUNK_REFS hash ids)."""
        line_no = 0
        for seg in line_segments(self.path, self.stats):
            lines = seg.split(b"\n")
            if not lines[-1]:
                lines.pop()
            for line in lines:
                line_no += 1
                self.line(line_no, line)
                if len(self.chunk) >= CHUNK_LINES or self.chunk.num_refs >= CHUNK_REFS:
                    yield from self._take()
        yield from self._take()

    def _take(self) -> Iterator[Chunk]:
        c, self.chunk = self.chunk, ChunkBuilder(self.path, self.on_error, self.stats)
        if len(c):
            yield c.build()


_MS_TIME = MOONCAKE_SPEC["timestamp"]  # a finite number of milliseconds, booleans refused


def read_aiperf(path: Path, on_error: str, stats: ReadStats) -> Iterator[Chunk]:
    """Parse the AIPerf trace PATH chunk by chunk (see the module's docstring)."""
    return AiperfReader(path, on_error, stats).chunks()
