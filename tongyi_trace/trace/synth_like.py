"""`kvtrace synth --like X`: a synthetic trace with the workload of a measured trace.

X is a workload summary (`kvtrace.workload/1`, written by `kvtrace fit` as RUN/fit/workload.json), a
run folder (its fit/workload.json, or the summary computed from the run), or an older policy file
(`kvtrace.policy/1`) that embeds the summary as "workload". The trace follows the conversational model
of the `to-c` profile (synth_chat.py: users, shared prompts, turns, think times, redos) with the
recorded mix: the type shares of conversations, the turn distribution (P(2nd turn) and the mean
number of further turns), lognormal lengths matched to the recorded median and 10-90% spread of each
type's first input, later input and output, the share of conversations that open with a shared
prefix, the session rate shape over the trace, the request count, duration and number of users.
Everything not recorded (think times, redos, user skew, prompt lengths) is the to-C profile's.

`load_workload` validates the summary in one place (one-line errors naming file and field).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tongyi_trace.errors import InputError
from tongyi_trace.run import RunDir
from tongyi_trace.schemas import WORKLOAD_SCHEMA
from tongyi_trace.trace.synth import MAX_REQUESTS, TO_C, SynthSummary, summarize, trace_size
from tongyi_trace.trace.synth_chat import ChatType, draw_chat
from tongyi_trace.trace.synth_core import BLOCK_SIZE_TOKENS, SynthTrace, assemble, write_jsonl

QUANTILE_LEVELS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
NUM_RATE_BINS = 24
UNKNOWN_TYPE = "unknown"
WORKLOAD_FILE = "workload.json"  # inside RUN/fit/
MAX_TOKENS = 1 << 20  # a recorded length above this (tokens) is a corrupt file, not a workload
MAX_USERS = 100_000_000
MAX_DURATION_S = 366 * 86_400.0
Z90 = 1.2815515655446004  # standard normal quantile at 0.9


def _quantiles(values: pl.Series) -> list[float]:
    if values.len() == 0:
        return []
    arr = values.cast(pl.Float64).to_numpy()
    return [float(x) for x in np.quantile(arr, QUANTILE_LEVELS)]


def workload_summary(run: RunDir) -> dict[str, Any]:
    """What `synth --like` needs besides the reuse parameters: request mix, turns, lengths, rate.

    Returns a JSON-ready dict of schema kvtrace.workload/1 (documented in docs/synth.md): counts and
    duration, the request rate and its shape over the trace, shares of requests and of first turns by
    type, the turn distribution, per-type quantiles (at QUANTILE_LEVELS) of the new input of first and
    of later turns (input minus the parent's input and output) and of the output, and the shared-prefix
    share of first turns (first turns with a prefix hit: shared system prompts)."""
    prov = run.provenance()
    req = run.requests().with_columns(pl.col("type").fill_null(UNKNOWN_TYPE), pl.col("turn").fill_null(1))
    n = req.height
    arrival_s = req["arrival_s"].to_numpy()
    t0 = float(arrival_s.min()) if n else 0.0
    duration_s = float(prov.get("duration_s") or (float(arrival_s.max()) - t0 if n else 0.0))
    parents = req.select(pl.col("chat_id").alias("parent_chat_id"),
                         (pl.col("input_tokens") + pl.col("output_tokens")).alias("parent_context"))
    req = req.join(parents, on="parent_chat_id", how="left").with_columns(
        new_input_tokens=pl.when(pl.col("parent_context").is_not_null())
        .then(pl.max_horizontal(pl.col("input_tokens") - pl.col("parent_context"), pl.lit(1)))
        .otherwise(pl.col("input_tokens")),
        is_root=pl.col("parent_context").is_null())
    roots = req.filter(pl.col("is_root"))
    types = sorted(req["type"].unique().to_list())
    edges = np.linspace(t0, t0 + max(duration_s, 1e-9), NUM_RATE_BINS + 1)
    shape, _ = np.histogram(roots["arrival_s"].to_numpy(), bins=edges)
    turns = req["turn"].to_numpy()
    lengths: dict[str, Any] = {}
    for ty in types:
        sub = req.filter(pl.col("type") == ty)
        lengths[ty] = {
            "first_input_tokens": _quantiles(sub.filter(pl.col("is_root"))["new_input_tokens"]),
            "next_input_tokens": _quantiles(sub.filter(~pl.col("is_root"))["new_input_tokens"]),
            "output_tokens": _quantiles(sub["output_tokens"]),
        }
    hits = _root_prefix_hit_share(run, roots["req_idx"])
    return {
        "schema": WORKLOAD_SCHEMA,
        "block_size": int(prov.get("block_size") or BLOCK_SIZE_TOKENS),
        "num_requests": n,
        "num_sessions": roots.height,
        "num_users": int(req["user_id"].drop_nulls().n_unique()) if prov.get("has_users") else None,
        "duration_s": duration_s,
        "request_rate_per_s": n / duration_s if duration_s > 0 else None,
        "session_rate_shape": [int(x) for x in shape],
        "type_share": {ty: float((req["type"] == ty).sum() / n) for ty in types},
        "first_turn_type_share": {ty: float((roots["type"] == ty).sum() / max(roots.height, 1)) for ty in types},
        "turn_share": {str(int(k)): float(v / n) for k, v in zip(*np.unique(turns, return_counts=True),
                                                                 strict=True)},
        "multi_turn_share": float(np.mean(turns >= 2)) if n else 0.0,
        "quantile_levels": list(QUANTILE_LEVELS),
        "lengths": lengths,
        "first_turn_prefix_hit_share": hits,
    }


def _root_prefix_hit_share(run: RunDir, root_idx: pl.Series) -> float | None:
    """Share of first turns whose first block was computed by an earlier request (a shared prefix)."""
    if root_idx.len() == 0:
        return None
    first = run.blocks(["req_idx", "pos", "chain_idx"]).filter(pl.col("pos") == 0)
    seen_before = first.with_columns(
        earlier=pl.col("req_idx") > pl.col("req_idx").min().over("chain_idx"))
    shared = seen_before.filter(pl.col("req_idx").is_in(root_idx.implode()))["earlier"]
    return float(shared.mean()) if shared.len() else None  # type: ignore[arg-type]


def _fail(path: Path, field: str, what: str) -> InputError:
    return InputError(f"{path}: field '{field}' {what}; fix it or regenerate it with 'kvtrace fit'")


def _number(path: Path, field: str, v: Any, lo: float, hi: float, integer: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _fail(path, field, f"must be a number, got {json.dumps(v)[:40]}")
    if not math.isfinite(v) or not lo <= v <= hi or (integer and v != int(v)):
        kind = "an integer" if integer else "a finite number"
        raise _fail(path, field, f"must be {kind} in [{lo:g}, {hi:g}], got {v}")
    return float(v)


def _numbers(path: Path, field: str, v: Any, lo: float, hi: float) -> list[float]:
    if not isinstance(v, list):
        raise _fail(path, field, "must be a list of numbers")
    return [_number(path, f"{field}[{i}]", x, lo, hi) for i, x in enumerate(v)]


def _shares(path: Path, field: str, v: Any) -> dict[str, float]:
    if not isinstance(v, dict):
        raise _fail(path, field, "must be an object of shares")
    return {str(k): _number(path, f"{field}.{k}", x, 0.0, 1.0) for k, x in v.items()}


@dataclass(frozen=True)
class Workload:
    """A validated kvtrace.workload/1 summary (the fields --like uses)."""

    num_requests: int
    duration_s: float
    num_users: int | None
    first_turn_type_share: dict[str, float]
    turn_share: dict[int, float]
    quantile_levels: list[float]
    lengths: dict[str, dict[str, list[float]]]
    session_rate_shape: list[float]
    prefix_share: float | None
    block_size: int | None  # the measured trace's tokens per hash id (None: not recorded)


def parse_workload(doc: Any, path: Path) -> Workload:
    """Validate a kvtrace.workload/1 document; every problem is one InputError naming PATH and field."""
    if not isinstance(doc, dict) or doc.get("schema") != WORKLOAD_SCHEMA:
        raise _fail(path, "schema", f"must be {WORKLOAD_SCHEMA!r}")
    for key in ("num_requests", "duration_s", "first_turn_type_share", "lengths", "quantile_levels"):
        if key not in doc:
            raise _fail(path, key, "is missing")
    n = int(_number(path, "num_requests", doc["num_requests"], 1, MAX_REQUESTS, integer=True))
    dur = _number(path, "duration_s", doc["duration_s"], 1e-3, MAX_DURATION_S)
    users = doc.get("num_users")
    num_users = None if users is None else int(_number(path, "num_users", users, 1, MAX_USERS, integer=True))
    block_size = (int(_number(path, "block_size", doc["block_size"], 1, 1 << 16, integer=True))
                  if "block_size" in doc else None)
    if "turn_buckets" in doc:
        tb = _numbers(path, "turn_buckets", doc["turn_buckets"], 1, 1 << 20)
        if not tb or tb != sorted(set(tb)) or any(x != int(x) for x in tb):
            raise _fail(path, "turn_buckets", "must be strictly ascending integers >= 1")
    types = _shares(path, "first_turn_type_share", doc["first_turn_type_share"])
    if not types or sum(types.values()) <= 0:
        raise _fail(path, "first_turn_type_share", "is empty or all zero")
    levels = _numbers(path, "quantile_levels", doc["quantile_levels"], 0.0, 1.0)
    if len(levels) < 2 or levels != sorted(levels):
        raise _fail(path, "quantile_levels", "must be at least 2 ascending levels in [0, 1]")
    if not isinstance(doc["lengths"], dict):
        raise _fail(path, "lengths", "must be an object per type")
    lengths: dict[str, dict[str, list[float]]] = {}
    for ty, per in doc["lengths"].items():
        if not isinstance(per, dict):
            raise _fail(path, f"lengths.{ty}", "must be an object")
        lengths[ty] = {}
        for key in ("first_input_tokens", "next_input_tokens", "output_tokens"):
            q = _numbers(path, f"lengths.{ty}.{key}", per.get(key) or [], 0, MAX_TOKENS)
            if q and (len(q) != len(levels) or q != sorted(q)):
                raise _fail(path, f"lengths.{ty}.{key}", f"must be {len(levels)} ascending quantiles")
            lengths[ty][key] = q
    turns = doc.get("turn_share") or {}
    if not isinstance(turns, dict):
        raise _fail(path, "turn_share", "must be an object of shares per turn number")
    turn_share: dict[int, float] = {}
    for k, v in turns.items():
        if not str(k).isdigit() or int(k) < 1:
            raise _fail(path, f"turn_share.{k}", "must be keyed by turn numbers >= 1")
        turn_share[int(k)] = _number(path, f"turn_share.{k}", v, 0.0, 1.0)
    shape = _numbers(path, "session_rate_shape", doc.get("session_rate_shape") or [1], 0, 1e12)
    if sum(shape) <= 0:
        shape = [1.0]
    prefix = doc.get("first_turn_prefix_hit_share")
    prefix_share = None if prefix is None else _number(path, "first_turn_prefix_hit_share", prefix, 0.0, 1.0)
    return Workload(n, dur, num_users, types, turn_share, levels, lengths, shape, prefix_share, block_size)


def load_workload(source: str | Path) -> Workload:
    """The workload of SOURCE: a workload.json, a run folder (its fit/workload.json, else computed from
    the run) or a kvtrace.policy/1 file embedding "workload"."""
    path = Path(source)
    if path.is_dir():
        wl_path = path / "fit" / WORKLOAD_FILE
        if not wl_path.exists():
            return parse_workload(workload_summary(RunDir(path)), path)
        path = wl_path
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise InputError(f"{path}: cannot read the workload ({e.strerror}); give a workload.json, a run "
                         "folder or a policy file") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not JSON ({e}); give a workload.json, a run folder or a policy file") from e
    if isinstance(doc, dict) and str(doc.get("schema", "")).startswith("kvtrace.policy/"):
        if not isinstance(doc.get("workload"), dict):
            raise _fail(path, "workload", f"is missing (this policy file embeds no {WORKLOAD_SCHEMA}); use "
                        "the run's fit/workload.json")
        return parse_workload(doc["workload"], path)
    return parse_workload(doc, path)


def _lognormal_of(q: list[float], levels: list[float], fallback: tuple[float, float]) -> tuple[float, float]:
    """(median, sigma) of the lognormal matching quantiles Q's median and 10-90% spread."""
    if not q:
        return fallback
    med, p10, p90 = (float(np.interp(x, levels, q)) for x in (0.5, 0.1, 0.9))
    sigma = math.log(max(p90, 1.0) / max(p10, 1.0)) / (2 * Z90)
    return max(med, 1.0), min(max(sigma, 0.05), 3.0)


def like_params(wl: Workload) -> Any:
    """The to-C model with WL's types, lengths, turn distribution and shared-prefix share."""
    s1 = wl.turn_share.get(1, 0.0)
    s2 = wl.turn_share.get(2, 0.0)
    second = min(s2 / s1, 0.99) if s1 > 0 else 0.0
    more = sum(v for k, v in wl.turn_share.items() if k >= 3) / s2 if s2 > 0 else 0.0
    median_more = max(more, 1e-3) / math.exp(TO_C.engagement[1] ** 2 / 2)
    base = TO_C.types["text"]
    types = {}
    for ty, share in sorted(wl.first_turn_type_share.items()):
        lens = wl.lengths.get(ty, {})
        first = _lognormal_of(lens.get("first_input_tokens", []), wl.quantile_levels, base.first_input)
        prompt_prob = wl.prefix_share if wl.prefix_share is not None else base.prompt_prob
        # the recorded first input includes the shared prompt: draw the rest of it
        first_own = (max(first[0] - prompt_prob * base.prompt_tokens[0], 1.0), first[1])
        types[ty] = ChatType(
            share, second, first_own,
            _lognormal_of(lens.get("next_input_tokens", []), wl.quantile_levels, first),
            _lognormal_of(lens.get("output_tokens", []), wl.quantile_levels, base.output),
            prompt_prob, base.num_prompts, base.prompt_tokens)
    # the recorded turn shares stand for every conversation: no extra background or long-chat classes
    return replace(TO_C, types=types, engagement=(median_more, TO_C.engagement[1]), slow_session_share=0.0,
                   long_chat=None)


def synth_like(source: str | Path, seed: int, num_requests: int | None = None,
               duration_s: float | None = None, scale: float = 1.0) -> tuple[Workload, SynthTrace]:
    """Draw the --like trace of SOURCE (see load_workload); returns (workload, trace)."""
    wl = load_workload(source)
    n, d = trace_size(seed, num_requests if num_requests is not None else wl.num_requests,
                      duration_s if duration_s is not None else wl.duration_s, scale)
    users = max(1, round(wl.num_users * n / wl.num_requests)) if wl.num_users else None
    sr = draw_chat(np.random.default_rng(seed), n, d, like_params(wl), users,
                   np.asarray(wl.session_rate_shape, dtype=np.float64))
    return wl, assemble(sr)


def synth_like_to_file(source: str | Path, seed: int, out: str | Path, num_requests: int | None = None,
                       duration_s: float | None = None, scale: float = 1.0) -> SynthSummary:
    """Generate the --like trace of SOURCE and write it to OUT as Bailian JSONL."""
    wl, trace = synth_like(source, seed, num_requests, duration_s, scale)
    path = Path(out)
    write_jsonl(trace, path)
    return summarize(trace, path, f"like:{Path(source).name}", seed, wl.block_size)
