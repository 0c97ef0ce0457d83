"""Which requests a replay sends, and when: the open-loop schedule.

Definition. From requests.parquet in arrival order: keep arrivals in [start_s, start_s + duration_s),
counted from the trace's first arrival (a trace whose clock does not start at 0 takes the same options);
keep whole sessions whose deterministic hash (seed, session_id) falls below sample_sessions (the time
pattern of the kept sessions is untouched); skip, and count, requests whose prompt + output exceed the
server's max_model_len; take the first max_requests. Request i is due at
    scheduled_s = (arrival_s - arrival_s of the first kept request) / speedup
after the replay starts (speedup inf: every request at 0, as a closed-loop load point sends them). With
closed sessions a child also waits until its parent (parent_chat_id, when the parent is replayed too) has
finished.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from tongyi_trace.errors import UsageError
from tongyi_trace.policy.file import load_policy
from tongyi_trace.run import RunDir
from tongyi_trace.splitmix import splitmix64
from tongyi_trace.trace.categories import context_categories


@dataclass(frozen=True)
class ScheduleOptions:
    """Selection and timing options of a replay (CLI flags of the same names)."""

    speedup: float = 1.0
    start_s: float = 0.0
    duration_s: float | None = None
    max_requests: int | None = None
    sample_sessions: float | None = None
    closed_sessions: bool = False
    max_output_tokens: int | None = None
    seed: int = 0


def tagged_requests(run: RunDir, policy_file: Path | None) -> pl.DataFrame:
    """RUN's requests with the category each is tagged with (kv_category): the one POLICY_FILE's policy keys
    on (its context classes appended when it was fitted with some), by default the run's fitted policy
    (RUN/fit/policy.json) when there is one, else the run's category."""
    requests = run.requests()
    path = policy_file if policy_file is not None else run.path / "fit" / "policy.json"
    if policy_file is None and not path.is_file():
        return requests
    return requests.with_columns(category=context_categories(requests, load_policy(path).context))


@dataclass(frozen=True)
class ScheduledRequest:
    """One request to send."""

    req_idx: int
    scheduled_s: float
    input_tokens: int
    max_tokens: int
    category: str
    session_id: int
    parent_req_idx: int | None
    arrival_s: float  # the request's time in the trace (sent to the engine as kv_time_s)


@dataclass(frozen=True)
class Schedule:
    """The requests to send, in dispatch order, and what was left out (counted, never silent)."""

    requests: list[ScheduledRequest]
    num_in_window: int
    num_sampled_out: int
    num_too_long: int
    num_over_max_requests: int


def _check(opts: ScheduleOptions) -> None:
    if not opts.speedup > 0:  # also refuses NaN; inf: every request due at once (a closed-loop load point)
        raise UsageError(f"--speedup {opts.speedup} must be a number > 0 (inf: every request at once)")
    if not (opts.start_s >= 0 and math.isfinite(opts.start_s)):
        raise UsageError(f"--start {opts.start_s} must be a finite number of seconds >= 0")
    if opts.duration_s is not None and not (opts.duration_s > 0 and math.isfinite(opts.duration_s)):
        raise UsageError(f"--duration {opts.duration_s} must be a finite number of seconds > 0")
    if opts.seed < 0:
        raise UsageError(f"--seed {opts.seed} must be >= 0")
    if opts.max_requests is not None and opts.max_requests <= 0:
        raise UsageError(f"--max-requests {opts.max_requests} must be > 0")
    if opts.sample_sessions is not None and not 0 < opts.sample_sessions <= 1:  # also refuses NaN
        raise UsageError(f"--sample-sessions {opts.sample_sessions} must be a fraction in (0, 1]")
    if opts.max_output_tokens is not None and opts.max_output_tokens < 1:
        raise UsageError(f"--max-output {opts.max_output_tokens} must be >= 1")


def session_fraction(session_ids: np.ndarray, seed: int) -> np.ndarray:
    """A deterministic uniform value in [0, 1) per session id (same id, same seed -> same value)."""
    ids = np.asarray(session_ids, dtype=np.int64).view(np.uint64)
    salt = splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) ^ np.uint64(0x5E55))
    h = splitmix64(ids + salt)
    return np.asarray((h >> np.uint64(11)).astype(np.float64) / float(1 << 53))


def build_schedule(requests: pl.DataFrame, opts: ScheduleOptions, max_model_len: int | None) -> Schedule:
    """Select and time the requests of REQUESTS (requests.parquet) per OPTS."""
    _check(opts)
    df = requests.sort("req_idx")
    lo = (float(df["arrival_s"].to_numpy().min()) if df.height else 0.0) + opts.start_s
    window = df.filter(pl.col("arrival_s") >= lo)
    if opts.duration_s is not None:
        window = window.filter(pl.col("arrival_s") < lo + opts.duration_s)
    num_in_window = window.height
    if opts.sample_sessions is not None and opts.sample_sessions < 1:
        frac = session_fraction(window["session_id"].to_numpy(), opts.seed)
        window = window.filter(pl.Series(frac < opts.sample_sessions))
    num_sampled_out = num_in_window - window.height
    out_tok = window["output_tokens"].to_numpy().clip(1, None)
    if opts.max_output_tokens is not None:
        out_tok = out_tok.clip(None, opts.max_output_tokens)
    window = window.with_columns(pl.Series("max_tokens", out_tok, dtype=pl.Int64))
    num_too_long = 0
    if max_model_len is not None:
        fits = (window["input_tokens"] + window["max_tokens"]) <= max_model_len
        num_too_long = int((~fits).sum())
        window = window.filter(fits)
    num_over = 0
    if opts.max_requests is not None and window.height > opts.max_requests:
        num_over = window.height - opts.max_requests
        window = window.head(opts.max_requests)
    if window.height == 0:
        return Schedule([], num_in_window, num_sampled_out, num_too_long, num_over)
    t0 = float(window["arrival_s"][0])
    chat_to_req = dict(zip(window["chat_id"].to_list(), window["req_idx"].to_list(), strict=True))
    out = [
        ScheduledRequest(req_idx=int(r["req_idx"]), scheduled_s=(float(r["arrival_s"]) - t0) / opts.speedup,
                         input_tokens=int(r["input_tokens"]), max_tokens=int(r["max_tokens"]),
                         category=str(r["category"]), session_id=int(r["session_id"]),
                         parent_req_idx=chat_to_req.get(r["parent_chat_id"])
                         if r["parent_chat_id"] is not None and r["parent_chat_id"] >= 0 else None,
                         arrival_s=float(r["arrival_s"]))
        for r in window.select("req_idx", "arrival_s", "input_tokens", "max_tokens", "category",
                               "session_id", "chat_id", "parent_chat_id").iter_rows(named=True)
    ]
    return Schedule(out, num_in_window, num_sampled_out, num_too_long, num_over)
