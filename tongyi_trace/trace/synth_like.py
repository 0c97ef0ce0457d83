"""`kvtrace synth --like policy.json`: a synthetic trace that reuses blocks as a fitted policy says.

Source: the per-category reuse model of "KVCache Cache in the Wild" (paper section 3 "Reuse time",
Fig 12-15, and section 4.2): after an access by a request of category w, a block is accessed again
within d seconds with probability F_w(d) = p_w (1 - exp(-lambda_w d)).

The generative model makes that exact. Sessions open at the recorded rate shape with the recorded mix
of first-turn types; after a request of category w (`<type>-<turn bucket>`, the policy's names) its
session sends a next turn with probability p_w (reuse_prob) after an Exp(lambda_w) delay (rate_per_s);
the next turn carries every block of the request (input lengths are whole blocks: no partial last
block), then the request's output and a new input. So a block accessed by a request of category w is
next accessed with probability p_w after an Exp(lambda_w) delay, and only by its own next turn: there
are no shared system prompts here (they would add reuse the policy does not describe). Turns past the
trace's end are dropped, as real ones are cut by the window (the fit treats them as censored).

New-input and output lengths are drawn per type from the quantiles recorded by `workload_summary`
(the policy file's "workload", written by `kvtrace fit`; format in docs/synth.md); the request count,
duration and number of users default to the recorded ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tongyi_trace.errors import InputError, UsageError
from tongyi_trace.fit.params import PolicyParams, load_policy
from tongyi_trace.run import RunDir
from tongyi_trace.trace.categories import categories
from tongyi_trace.trace.synth import SynthSummary, ToCParams, activity_weights, select_requests, summarize
from tongyi_trace.trace.synth_core import BLOCK_SIZE_TOKENS, F64, SessionRequests, assemble, write_jsonl

WORKLOAD_SCHEMA = "kvtrace.workload/1"
QUANTILE_LEVELS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
NUM_RATE_BINS = 24
MAX_TURNS = 1000
UNKNOWN_TYPE = "unknown"


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


def _workload(policy: PolicyParams, path: Path) -> dict[str, Any]:
    wl = policy.extra.get("workload")
    if not isinstance(wl, dict) or wl.get("schema") != WORKLOAD_SCHEMA:
        raise InputError(f"{path}: field 'workload' is missing or not {WORKLOAD_SCHEMA!r}; refit with "
                         "'kvtrace fit' of this kvtrace version (it records the request mix and lengths)")
    for key in ("num_requests", "duration_s", "first_turn_type_share", "lengths", "quantile_levels"):
        if key not in wl:
            raise InputError(f"{path}: field 'workload.{key}' is missing; refit with 'kvtrace fit'")
    return wl


def _sample_quantiles(rng: np.random.Generator, qs: list[float], levels: list[float], size: int,
                      fallback: list[float]) -> F64:
    """Inverse-CDF sampling, piecewise linear between the recorded quantiles."""
    q = qs or fallback
    if not q:
        return np.full(size, float(BLOCK_SIZE_TOKENS))
    return np.asarray(np.interp(rng.random(size), levels, q), dtype=np.float64)


def _turn_params(policy: PolicyParams, types: list[str]) -> tuple[F64, F64]:
    """reuse_prob and rate_per_s for [type, turn 1..MAX_TURNS] from the policy's categories."""
    probs = np.empty((len(types), MAX_TURNS))
    rates = np.empty((len(types), MAX_TURNS))
    turns = pl.Series(np.arange(1, MAX_TURNS + 1))
    for i, ty in enumerate(types):
        names = categories(pl.Series([ty] * MAX_TURNS), turns, policy.turn_buckets).to_list()
        params = [policy.for_category(name) for name in names]
        probs[i] = [c.reuse_prob for c in params]
        rates[i] = [c.rate_per_s for c in params]
    probs[:, -1] = 0.0
    return probs, rates


def draw_like(rng: np.random.Generator, policy: PolicyParams, wl: dict[str, Any], num_requests: int,
              duration_s: float, num_users: int | None) -> SessionRequests:
    """Sessions following POLICY's per-category reuse and WL's mix and lengths (see module doc)."""
    types = sorted(wl["first_turn_type_share"])
    share = np.array([wl["first_turn_type_share"][t] for t in types], dtype=np.float64)
    if not types or share.sum() <= 0:
        raise InputError("policy file: field 'workload.first_turn_type_share' is empty; refit with 'kvtrace fit'")
    probs, rates = _turn_params(policy, types)
    levels = [float(x) for x in wl["quantile_levels"]]
    duration_ms = round(duration_s * 1000)
    shape = np.asarray(wl.get("session_rate_shape") or [1], dtype=np.float64)
    shape = shape / shape.sum() if shape.sum() > 0 else np.full(shape.size, 1.0 / shape.size)
    user_w = activity_weights(rng, num_users, ToCParams().user_activity_sigma) if num_users else None
    num_sessions = max(8, num_requests // 2)
    while True:
        sr = _draw_sessions(rng, num_sessions, types, share, probs, rates, shape, duration_ms, user_w)
        keep = np.asarray(sr.arrival_ms < duration_ms)
        # a session's turns are in time order: dropping past-the-end turns keeps a prefix of each
        out = select_requests(sr, keep, num_requests)
        if out is not None:
            return _with_lengths(rng, out, types, wl, levels)
        num_sessions *= 2


def _draw_sessions(rng: np.random.Generator, num_sessions: int, types: list[str], share: F64, probs: F64,
                   rates: F64, shape: F64, duration_ms: int, user_w: F64 | None) -> SessionRequests:
    s_type = rng.choice(len(types), size=num_sessions, p=share / share.sum())
    bins = rng.choice(shape.size, size=num_sessions, p=shape)
    s_t0 = ((bins + rng.random(num_sessions)) * (duration_ms / shape.size)).astype(np.int64)
    s_user = rng.choice(user_w.size, size=num_sessions, p=user_w) if user_w is not None else \
        np.full(num_sessions, -1, dtype=np.int64)
    # walk the turns: the active sessions after turn k continue w.p. p_w, after Exp(lambda_w)
    times = [s_t0]
    alive = np.arange(num_sessions)
    t = s_t0.copy()
    for k in range(MAX_TURNS - 1):
        p = probs[s_type[alive], k]
        go = rng.random(alive.size) < p
        alive, t = alive[go], t[go]
        if alive.size == 0:
            break
        rate = rates[s_type[alive], k]
        delay_ms = np.maximum(1, np.rint(rng.exponential(1.0, alive.size) / np.maximum(rate, 1e-12) * 1000))
        t = t + np.minimum(delay_ms, 1 << 50).astype(np.int64)
        nxt = np.full(num_sessions, -1, dtype=np.int64)
        nxt[alive] = t
        times.append(nxt)
        # sessions already past the end cannot produce kept turns: stop walking them
        inside = t < duration_ms
        alive, t = alive[inside], t[inside]
    grid = np.stack(times, axis=1)  # [session, turn], -1 = no such turn
    has = grid >= 0
    turns_per = has.sum(axis=1)
    session = np.repeat(np.arange(num_sessions, dtype=np.int64), turns_per)
    turn = np.nonzero(has)[1].astype(np.int64) + 1
    n = session.size
    zeros = np.zeros(n, dtype=np.int64)
    return SessionRequests(
        session=session, turn=turn, arrival_ms=grid[has].astype(np.int64),
        type_code=s_type[session].astype(np.int64), user=s_user[session].astype(np.int64),
        sys_id=np.full(n, -1, dtype=np.int64), new_tokens=zeros, output_tokens=zeros,
        type_names=tuple(types), sys_tokens_by_id=np.zeros(0, dtype=np.int64))


def _with_lengths(rng: np.random.Generator, sr: SessionRequests, types: list[str], wl: dict[str, Any],
                  levels: list[float]) -> SessionRequests:
    n = sr.session.size
    new = np.empty(n, dtype=np.float64)
    out = np.empty(n, dtype=np.float64)
    for i, ty in enumerate(types):
        lens = wl["lengths"].get(ty) or {}
        first_q = lens.get("first_input_tokens") or []
        for mask, key in (((sr.type_code == i) & (sr.turn == 1), "first_input_tokens"),
                          ((sr.type_code == i) & (sr.turn > 1), "next_input_tokens")):
            new[mask] = _sample_quantiles(rng, lens.get(key) or [], levels, int(mask.sum()), first_q)
        m = sr.type_code == i
        out[m] = _sample_quantiles(rng, lens.get("output_tokens") or [], levels, int(m.sum()), [])
    out_tok = np.maximum(0, np.rint(out)).astype(np.int64)
    new_tok = np.maximum(1, np.rint(new)).astype(np.int64)
    # whole blocks: a root's input, and (parent output + new input) of a later turn, round up to 16
    prev_out = np.where(sr.turn > 1, np.roll(out_tok, 1), 0)
    b = BLOCK_SIZE_TOKENS
    new_tok = (-(-(prev_out + new_tok) // b)) * b - prev_out
    return SessionRequests(
        session=sr.session, turn=sr.turn, arrival_ms=sr.arrival_ms, type_code=sr.type_code, user=sr.user,
        sys_id=sr.sys_id, new_tokens=new_tok.astype(np.int64), output_tokens=out_tok,
        type_names=sr.type_names, sys_tokens_by_id=sr.sys_tokens_by_id)


def synth_like(policy_path: str | Path, seed: int, num_requests: int | None = None,
               duration_s: float | None = None, scale: float = 1.0) -> tuple[PolicyParams, Any]:
    """Draw the --like trace for the policy file at POLICY_PATH; returns (policy, SynthTrace)."""
    path = Path(policy_path)
    policy = load_policy(path)
    wl = _workload(policy, path)
    if scale <= 0:
        raise UsageError(f"--scale must be > 0, got {scale}")
    n = round((num_requests if num_requests is not None else int(wl["num_requests"])) * scale)
    d = float(duration_s if duration_s is not None else wl["duration_s"])
    if n < 1:
        raise UsageError(f"the trace would have {n} requests; use --requests >= 1")
    if not d > 0:
        raise UsageError(f"--duration must be > 0 seconds, got {d}")
    users = wl.get("num_users")
    num_users = max(1, round(int(users) * n / max(int(wl["num_requests"]), 1))) if users else None
    sr = draw_like(np.random.default_rng(seed), policy, wl, n, d, num_users)
    return policy, assemble(sr)


def synth_like_to_file(policy_path: str | Path, seed: int, out: str | Path, num_requests: int | None = None,
                       duration_s: float | None = None, scale: float = 1.0) -> SynthSummary:
    """Generate the --like trace of POLICY_PATH and write it to OUT as Bailian JSONL."""
    _, trace = synth_like(policy_path, seed, num_requests, duration_s, scale)
    path = Path(out)
    write_jsonl(trace, path)
    return summarize(trace, path, f"like:{Path(policy_path).name}", seed)
