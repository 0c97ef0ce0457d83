"""Per-request replay records: one JSON line per request sent, appended and flushed as it completes (or, at a
stop, as it is cancelled).

Fields (docs/artifacts/replay.md): req_idx, session_id, category, scheduled_s, sent_s, drift_ms, ttft_ms,
e2e_ms, prompt_tokens (sent), engine_prompt_tokens (usage.prompt_tokens), cached_tokens
(usage.prompt_tokens_details.cached_tokens), output_tokens (usage.completion_tokens), max_tokens,
status ("ok" | "error" | "cancelled": in flight at a stop, cut off after the grace), http_status, error,
instance (the index in the replay's --server list of the engine that served it; 0 with one server), held_ms
(how long --max-in-flight or --closed-sessions held it back after its due time; drift_ms is the client's own
lateness after that), retries (re-sends after HTTP 429/503), retry_wait_ms (the time waited before them, as
the server's Retry-After asked). Times are seconds / milliseconds from the replay's start.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import polars as pl

from tongyi_trace.atomic import commit_point
from tongyi_trace.errors import InputError

RECORD_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "req_idx": pl.Int64, "session_id": pl.Int64, "category": pl.Utf8, "scheduled_s": pl.Float64,
    "sent_s": pl.Float64, "drift_ms": pl.Float64, "ttft_ms": pl.Float64, "e2e_ms": pl.Float64,
    "prompt_tokens": pl.Int64, "engine_prompt_tokens": pl.Int64, "cached_tokens": pl.Int64,
    "output_tokens": pl.Int64, "max_tokens": pl.Int64, "status": pl.Utf8, "http_status": pl.Int64,
    "error": pl.Utf8, "tpot_ms": pl.Float64, "itl_ms": pl.List(pl.Float64), "instance": pl.Int64,
    "held_ms": pl.Float64, "retries": pl.Int64, "retry_wait_ms": pl.Float64,
}


@dataclass
class RequestRecord:
    """What happened to one request."""

    req_idx: int
    session_id: int
    category: str
    scheduled_s: float
    sent_s: float
    drift_ms: float
    ttft_ms: float | None
    e2e_ms: float | None
    prompt_tokens: int
    engine_prompt_tokens: int | None
    cached_tokens: int | None
    output_tokens: int | None
    max_tokens: int
    status: str
    http_status: int | None
    error: str | None
    tpot_ms: float | None = None  # (last token - first token) / (output tokens - 1), ok requests
    itl_ms: list[float] | None = None  # gaps between successive streamed chunks carrying tokens
    instance: int = 0  # the engine that served it: its index in the replay's --server list
    held_ms: float = 0.0  # held back after its due time by --max-in-flight or --closed-sessions (not drift)
    retries: int = 0  # re-sends after HTTP 429/503 (the server's Retry-After honoured)
    retry_wait_ms: float = 0.0  # the time waited before those re-sends

    @property
    def ok(self) -> bool:
        """True when the request completed and reported its usage."""
        return self.status == "ok"


class RecordWriter:
    """Appends records to records.jsonl, one flushed line each (a crash keeps every finished request)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[str] = path.open("a", encoding="utf-8")

    def write(self, rec: RequestRecord) -> None:
        """Append REC as one JSON line and flush it to the OS (a committed write: atomic.commit_point)."""
        self._fh.write(json.dumps(asdict(rec), separators=(",", ":")) + "\n")
        self._fh.flush()
        commit_point(self.path)

    def close(self) -> None:
        """Close the file."""
        self._fh.close()


def read_records(path: Path) -> pl.DataFrame:
    """records.jsonl as a table (RECORD_SCHEMA). A last line without its newline that is not JSON was cut
    mid-write (the process was killed): that request counts as not finished. Any other bad line is an
    error."""
    rows: list[dict[str, Any]] = []
    if path.is_file():
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                if i == len(lines):  # no newline after it: cut mid-write
                    continue
                raise InputError(f"{path}:{i}: not a JSON record ({e.msg}); fix or delete that line") from e
    return pl.DataFrame(rows, schema=RECORD_SCHEMA)
