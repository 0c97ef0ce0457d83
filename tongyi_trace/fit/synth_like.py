"""`kvtrace synth --like X`: the synthetic twin of a measured trace.

X is a workload summary (`kvtrace.workload/2`, written by `kvtrace fit` as RUN/fit/workload.json), a
run folder (its fit/workload.json, or the summary computed from the run), or a policy file
(`kvtrace.policy/1`) that embeds the summary as "workload". The summary holds the run's counts,
request mix and length quantiles, and in "twin" the prefix-tree model of fit/synth_twin.py (what
is learned and what is drawn: docs/synth.md, "The twin of a run"). The twin is written in the run's
own block size: Qwen-Bailian JSONL for 16-token blocks, Mooncake JSONL for 512-token ones (the formats
ingest reads with those sizes), Bailian with a note to pass --block-size otherwise.
`calibration/twin.py` measures the twin against the run (`synth --like RUN --check`).

`load_workload` validates the summary in one place (one-line errors naming file and field); a
kvtrace.workload/1 file (no twin model) is refused with what to do.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tongyi_trace.errors import InputError, brief
from tongyi_trace.fit.synth_twin import LRU_POINTS, NUM_REUSE_BINS, TwinModel, draw_twin, learn_twin, twin_model
from tongyi_trace.run import RunDir, RunTables, check_not_run_table
from tongyi_trace.schemas import WORKLOAD_SCHEMA
from tongyi_trace.trace.formats import DEFAULT_BLOCK_SIZE
from tongyi_trace.trace.synth import MAX_REQUESTS, SynthSummary, summarize, trace_size
from tongyi_trace.trace.synth_core import BLOCK_SIZE_TOKENS, SynthTrace, write_jsonl, write_mooncake_jsonl

QUANTILE_LEVELS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
NUM_RATE_BINS = 24
UNKNOWN_TYPE = "unknown"
WORKLOAD_FILE = "workload.json"  # inside RUN/fit/
MAX_TOKENS = 1 << 20  # a recorded length above this (tokens) is a corrupt file, not a workload
MAX_USERS = 100_000_000
MAX_DURATION_S = 366 * 86_400.0
OLD_WORKLOAD_SCHEMA = "kvtrace.workload/1"


def _quantiles(values: pl.Series) -> list[float]:
    if values.len() == 0:
        return []
    arr = values.cast(pl.Float64).to_numpy()
    return [float(x) for x in np.quantile(arr, QUANTILE_LEVELS)]


def workload_summary(tables: RunTables, twin: bool = True) -> dict[str, Any]:
    """What `synth --like` needs besides the reuse parameters: request mix, turns, lengths, rate.

    Returns a JSON-ready dict of schema kvtrace.workload/2 (documented in docs/synth.md): counts and
    duration, the request rate and its shape over the trace, shares of requests and of first turns by
    type, the turn distribution, per-type quantiles (at QUANTILE_LEVELS) of the new input of first and
    of later turns (input minus the parent's input and output) and of the output, and the shared-prefix
    share of first turns (first turns with a prefix hit: shared system prompts); "twin" is the prefix-tree
    model the twin is drawn from (synth_twin.learn_twin), null without TWIN (learning it holds the whole
    stream: `kvtrace fit` leaves it out when the stream does not fit its memory budget, and says so)."""
    prov = tables.provenance
    req = tables.requests().with_columns(pl.col("type").fill_null(UNKNOWN_TYPE), pl.col("turn").fill_null(1))
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
    hits = _root_prefix_hit_share(tables, roots["req_idx"])
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
        "twin": learn_twin(tables) if twin else None,
    }


def _root_prefix_hit_share(tables: RunTables, root_idx: pl.Series) -> float | None:
    """Share of first turns whose first block was computed by an earlier request (a shared prefix)."""
    if root_idx.len() == 0:
        return None
    first = (pl.scan_parquet(tables.blocks_path).filter(pl.col("pos") == 0)  # the first blocks only, read so
             .select("req_idx", "pos", "chain_idx").collect())
    seen_before = first.with_columns(
        earlier=pl.col("req_idx") > pl.col("req_idx").min().over("chain_idx"))
    shared = seen_before.filter(pl.col("req_idx").is_in(root_idx.implode()))["earlier"]
    return float(shared.mean()) if shared.len() else None  # type: ignore[arg-type]


def _fail(path: Path, field: str, what: str) -> InputError:
    return InputError(f"{path}: field '{field}' {what}; fix it or regenerate it with 'kvtrace fit'")


def _number(path: Path, field: str, v: Any, lo: float, hi: float, integer: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _fail(path, field, f"must be a number, got {brief(json.dumps(v), 40)}")
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
    """A validated kvtrace.workload/2 summary (the fields --like uses)."""

    num_requests: int
    duration_s: float
    type_share: dict[str, float]
    block_size: int  # the measured trace's tokens per hash id
    twin: TwinModel


def _quantile_list(path: Path, field: str, v: Any, num_levels: int, lo: float, hi: float,
                   allow_empty: bool = True) -> list[float]:
    q = _numbers(path, field, v, lo, hi)
    if (q or not allow_empty) and (len(q) != num_levels or q != sorted(q)):
        raise _fail(path, field, f"must be {num_levels} ascending quantiles")
    return q


def _parse_twin(doc: Any, path: Path) -> TwinModel:
    """Validate the "twin" section (synth_twin.learn_twin); every problem names PATH and the field."""
    if not isinstance(doc, dict):
        raise _fail(path, "twin", "must be an object (the prefix-tree model)")
    for key in ("quantile_levels", "rate_bins", "requests_per_instant", "input_tokens", "output_tokens",
                "length_class_edges", "by_length_class", "shared_class_edges", "by_shared_class"):
        if key not in doc:
            raise _fail(path, f"twin.{key}", "is missing")
    levels = _numbers(path, "twin.quantile_levels", doc["quantile_levels"], 0.0, 1.0)
    if len(levels) < 2 or levels != sorted(levels) or levels[0] != 0.0 or levels[-1] != 1.0:
        raise _fail(path, "twin.quantile_levels", "must be ascending levels from 0 to 1")
    nl = len(levels)
    rate = _numbers(path, "twin.rate_bins", doc["rate_bins"], 0, 1e12)
    if not rate or sum(rate) <= 0:
        raise _fail(path, "twin.rate_bins", "must be a non-empty list of counts, not all zero")
    for key in ("requests_per_instant", "input_tokens", "output_tokens"):
        _quantile_list(path, f"twin.{key}", doc[key], nl, 0, MAX_TOKENS, allow_empty=False)
    _number(path, "twin.ideal_hit", doc.get("ideal_hit"), 0.0, 1.0)
    lru = _numbers(path, "twin.lru_hit", doc.get("lru_hit"), 0.0, 1.0)
    if len(lru) != len(LRU_POINTS):
        raise _fail(path, "twin.lru_hit", f"must be {len(LRU_POINTS)} hit ratios (at {', '.join(LRU_POINTS)})")
    per_class: list[tuple[str, str, tuple[str, ...]]] = [
        ("length_class_edges", "by_length_class", ("shared_share", "donor_uses")),
        ("shared_class_edges", "by_shared_class", ("gap_s", "donor_share"))]
    for edges_key, classes_key, keys in per_class:
        edges = _numbers(path, f"twin.{edges_key}", doc[edges_key], 0, MAX_TOKENS)
        if edges != sorted(set(edges)):
            raise _fail(path, f"twin.{edges_key}", "must be strictly ascending")
        classes = doc[classes_key]
        if not isinstance(classes, list) or len(classes) != len(edges) + 1 or \
                not all(isinstance(c, dict) for c in classes):
            raise _fail(path, f"twin.{classes_key}", f"must be a list of {len(edges) + 1} objects (one a class)")
        for i, c in enumerate(classes):
            for key in keys:
                hi = 1.0 if key.endswith("share") else MAX_DURATION_S if key == "gap_s" else MAX_REQUESTS
                _quantile_list(path, f"twin.{classes_key}[{i}].{key}", c.get(key), nl, 0.0, hi)
            if classes_key == "by_length_class":
                _number(path, f"twin.{classes_key}[{i}].hit_share", c.get("hit_share"), 0.0, 1.0)
    num_classes = len(doc["by_length_class"])
    by_time = doc.get("hit_share_by_time")
    if not isinstance(by_time, list) or not by_time or \
            not all(isinstance(row, list) and len(row) == num_classes for row in by_time):
        raise _fail(path, "twin.hit_share_by_time", f"must be a list of time bins, each {num_classes} shares "
                    "(one a length class)")
    for b, row in enumerate(by_time):
        for c, x in enumerate(row):
            _number(path, f"twin.hit_share_by_time[{b}][{c}]", x, 0.0, 1.0)
    if "reuse_time_cdf" in doc:  # absent in a summary of an earlier kvtrace: the draw then ignores it
        cdf = _numbers(path, "twin.reuse_time_cdf", doc["reuse_time_cdf"], 0.0, 1.0)
        if len(cdf) != NUM_REUSE_BINS or cdf != sorted(cdf):
            raise _fail(path, "twin.reuse_time_cdf", f"must be {NUM_REUSE_BINS} ascending shares (one a log bin)")
    return twin_model(doc)


def parse_workload(doc: Any, path: Path) -> Workload:
    """Validate a kvtrace.workload/2 document; every problem is one InputError naming PATH and field."""
    if isinstance(doc, dict) and doc.get("schema") == OLD_WORKLOAD_SCHEMA:
        raise InputError(f"{path}: a {OLD_WORKLOAD_SCHEMA} summary (from an older kvtrace) has no twin model; "
                         f"give the run folder, or rewrite it with 'kvtrace fit RUN' ({WORKLOAD_SCHEMA})")
    if not isinstance(doc, dict) or doc.get("schema") != WORKLOAD_SCHEMA:
        raise _fail(path, "schema", f"must be {WORKLOAD_SCHEMA!r}")
    for key in ("num_requests", "duration_s", "block_size", "type_share", "twin"):
        if key not in doc:
            raise _fail(path, key, "is missing")
    if doc["twin"] is None:
        raise InputError(f"{path}: has no twin model: the fit that wrote it could not hold the run's whole stream "
                         "in its --memory-limit-gib; rerun 'kvtrace fit RUN' with a larger --memory-limit-gib")
    n = int(_number(path, "num_requests", doc["num_requests"], 1, MAX_REQUESTS, integer=True))
    dur = _number(path, "duration_s", doc["duration_s"], 1e-3, MAX_DURATION_S)
    block_size = int(_number(path, "block_size", doc["block_size"], 1, 1 << 16, integer=True))
    types = _shares(path, "type_share", doc["type_share"])
    if not types or sum(types.values()) <= 0:
        raise _fail(path, "type_share", "is empty or all zero")
    return Workload(n, dur, types, block_size, _parse_twin(doc["twin"], path))


def load_workload(source: str | Path) -> Workload:
    """The workload of SOURCE: a workload.json, a run folder (its fit/workload.json, else computed from
    the run) or a kvtrace.policy/1 file embedding "workload"."""
    path = Path(source)
    if path.is_dir():
        wl_path = path / "fit" / WORKLOAD_FILE
        if not wl_path.exists():
            return parse_workload(workload_summary(RunDir(path).tables()), path)
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


def synth_like(source: str | Path, seed: int, num_requests: int | None = None,
               duration_s: float | None = None, scale: float = 1.0) -> tuple[Workload, SynthTrace]:
    """Draw the twin of SOURCE (see load_workload) for SEED; returns (workload, trace)."""
    wl = load_workload(source)
    n, d = trace_size(seed, num_requests if num_requests is not None else wl.num_requests,
                      duration_s if duration_s is not None else wl.duration_s, scale)
    rng = np.random.default_rng(seed)
    tw = draw_twin(wl.twin, rng, n, d, wl.block_size)
    names = tuple(sorted(wl.type_share))
    weights = np.asarray([wl.type_share[t] for t in names], dtype=np.float64)
    type_code = np.searchsorted(np.cumsum(weights) / weights.sum(), rng.random(n), side="right")
    ids = np.arange(n, dtype=np.int64)
    trace = SynthTrace(
        chat_id=ids, parent_chat_id=np.full(n, -1, dtype=np.int64), arrival_ms=tw.arrival_ms,
        input_tokens=tw.input_tokens, output_tokens=tw.output_tokens,
        type_code=np.minimum(type_code, len(names) - 1).astype(np.int64), turn=np.ones(n, dtype=np.int64),
        user=np.full(n, -1, dtype=np.int64), hash_ids=tw.hash_ids, offsets=tw.offsets, type_names=names)
    return wl, trace


def synth_like_to_file(source: str | Path, seed: int, out: str | Path, num_requests: int | None = None,
                       duration_s: float | None = None, scale: float = 1.0) -> SynthSummary:
    """Draw the twin of SOURCE and write it to OUT in the run's block size: Mooncake JSONL for 512-token
    blocks, Qwen-Bailian JSONL otherwise."""
    path = Path(out)
    check_not_run_table(path, "-o")
    wl, trace = synth_like(source, seed, num_requests, duration_s, scale)
    if wl.block_size == DEFAULT_BLOCK_SIZE["mooncake"]:
        write_mooncake_jsonl(trace, path)
    else:
        write_jsonl(trace, path, with_users=False)
    return replace(summarize(trace, path, f"like:{Path(source).name}", seed, wl.block_size),
                   block_size=wl.block_size)
