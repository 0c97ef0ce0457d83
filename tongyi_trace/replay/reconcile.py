"""Reconciliation: per request, the trace's ideal hit, the simulator's predicted hit and the engine's hit.

Definition. For the requests that completed, in the order they were sent, at the ENGINE's block size:
  ideal_hit_tokens     = tongyi_trace.sim.engine_model.predict_request_hits(..., num_engine_blocks=None)
                         (unlimited cache: every full engine block computed before is reused),
  predicted_hit_tokens = the same at the engine's num_gpu_blocks (the model takes off vLLM's null block)
                         and the output tokens the engine generated, under the policy the engine ran
                         (`engine_policy`): LRU for stock vLLM, the plugin's wa or fitted with its policy
                         file and guard settings (predict_guarded, the engine's guard step per request),
  predicted_policy     = that policy's name (aggregate),
  engine_cached_tokens = usage.prompt_tokens_details.cached_tokens reported by the engine.
Aggregates: token hit ratios of the three, exact-agreement share, mean absolute gap, and the requests
where engine and prediction disagree most. No peer puts these side by side (peers.md, point 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from tongyi_trace.errors import InputError
from tongyi_trace.policy.file import PolicyParams, load_policy
from tongyi_trace.run import RunDir

RECONCILE_SCHEMA: dict[str, type[pl.DataType]] = {
    "order": pl.Int64, "req_idx": pl.Int64, "category": pl.Utf8, "prompt_tokens": pl.Int64,
    "output_tokens": pl.Int64, "ideal_hit_tokens": pl.Int64, "predicted_hit_tokens": pl.Int64,
    "engine_cached_tokens": pl.Int64, "engine_minus_predicted": pl.Int64, "ttft_ms": pl.Float64,
}


@dataclass(frozen=True)
class Reconciliation:
    """The per-request table (RECONCILE_SCHEMA) and its aggregates (JSON-ready)."""

    table: pl.DataFrame
    aggregate: dict[str, Any]


def guard_params(plugin: dict[str, Any] | None) -> dict[str, Any]:
    """WA's guard and refit parameters (WaParams names) that the plugin behind PLUGIN (its stats) was started
    with, whatever policy it ran; none recorded (no plugin, or a stats file older than the settings): {} =
    WA's defaults, what the plugin runs unless told."""
    settings = (plugin or {}).get("guard_settings")
    return dict(settings) if isinstance(settings, dict) else {}


def engine_policy(plugin: dict[str, Any] | None) -> tuple[str, PolicyParams | None, str | None]:
    """(policy, policy file, note) the engine ran, from the plugin's stats PLUGIN (None: stock vLLM, LRU):
    the plugin's wa or fitted with the policy file it loaded; LRU, with a note saying why, when that file
    cannot be read or the plugin ran a mode the prediction does not model."""
    mode = str((plugin or {}).get("mode") or "lru")
    if mode == "lru":
        return "lru", None, None
    if mode not in ("wa", "fitted"):
        return "lru", None, f"the plugin ran {mode}: predicted as LRU"
    path = (plugin or {}).get("policy_path")
    if not path:
        return "lru", None, f"the plugin ran {mode} without a recorded policy file: predicted as LRU"
    try:
        return mode, load_policy(path), None
    except InputError as e:
        return "lru", None, f"the plugin's policy file is unreadable ({e}): predicted as LRU"


def predict_hits(run: RunDir, recs: pl.DataFrame, engine_block_size: int, num_gpu_blocks: int | None,
                 policy: str = "lru", params: PolicyParams | None = None,
                 guard: dict[str, Any] | None = None) -> np.ndarray:
    """Simulator hit tokens of each of RECS (completed records, in send order) on the engine: LRU (None
    blocks: the unlimited cache), or the plugin's wa / fitted with PARAMS and the guard settings GUARD."""
    from tongyi_trace.sim.engine_model import predict_request_hits

    req_idx = recs["req_idx"].to_numpy().astype(np.int64)
    out_tok = recs["output_tokens"].fill_null(recs["max_tokens"]).to_numpy().astype(np.int64)
    if policy == "lru" or params is None or num_gpu_blocks is None:
        hits = predict_request_hits(run.tables(), req_idx, engine_block_size, num_gpu_blocks, policy="lru",
                                    output_tokens=out_tok)
    else:
        from tongyi_trace.sim.guarded import predict_guarded

        hits = predict_guarded(run.tables(), req_idx, engine_block_size, num_gpu_blocks, policy, params, guard or {},
                               out_tok).result.req_hit_tokens
    return np.asarray(hits, dtype=np.int64)


def reconcile(run: RunDir, ok_records: pl.DataFrame, engine_block_size: int, num_gpu_blocks: int,
              num_worst: int = 20, plugin: dict[str, Any] | None = None) -> Reconciliation:
    """Build the reconciliation of OK_RECORDS (status ok, any order) against the simulator running what
    the engine ran (PLUGIN: the plugin's stats over the replay; None: stock vLLM)."""
    recs = ok_records.sort("sent_s")
    req_idx = recs["req_idx"].to_numpy().astype(np.int64)
    out_tok = recs["output_tokens"].fill_null(recs["max_tokens"]).to_numpy().astype(np.int64)
    policy, params, note = engine_policy(plugin)
    ideal = predict_hits(run, recs, engine_block_size, None)
    pred = predict_hits(run, recs, engine_block_size, num_gpu_blocks, policy, params, guard_params(plugin))
    engine = recs["cached_tokens"].to_numpy().astype(np.int64)
    table = pl.DataFrame({
        "order": np.arange(len(recs), dtype=np.int64), "req_idx": req_idx, "category": recs["category"],
        "prompt_tokens": recs["prompt_tokens"], "output_tokens": out_tok, "ideal_hit_tokens": ideal,
        "predicted_hit_tokens": pred, "engine_cached_tokens": engine, "engine_minus_predicted": engine - pred,
        "ttft_ms": recs["ttft_ms"],
    }, schema=RECONCILE_SCHEMA)
    agg = {"predicted_policy": policy, **aggregate_reconciliation(table, num_worst)}
    if note:
        agg["predicted_policy_note"] = note
    return Reconciliation(table, agg)


def aggregate_reconciliation(table: pl.DataFrame, num_worst: int = 20) -> dict[str, Any]:
    """Hit ratios, agreement share, gaps and worst disagreements of a reconciliation table."""
    prompt = int(table["prompt_tokens"].sum() or 0)
    if table.height == 0 or prompt == 0:
        return {"num_requests": table.height, "prompt_tokens": prompt}
    ideal = int(table["ideal_hit_tokens"].sum())
    pred = int(table["predicted_hit_tokens"].sum())
    eng = int(table["engine_cached_tokens"].sum())
    gap = table["engine_minus_predicted"]
    worst = (table.with_columns(pl.col("engine_minus_predicted").abs().alias("_abs"))
             .filter(pl.col("_abs") > 0).sort(["_abs", "order"], descending=[True, False])
             .head(num_worst).drop("_abs"))
    by_cat = (table.group_by("category").agg(
        pl.len().alias("num_requests"), pl.col("prompt_tokens").sum(), pl.col("ideal_hit_tokens").sum(),
        pl.col("predicted_hit_tokens").sum(), pl.col("engine_cached_tokens").sum(),
        (pl.col("engine_minus_predicted") == 0).mean().alias("exact_share")).sort("category"))
    return {
        "num_requests": table.height,
        "prompt_tokens": prompt,
        "ideal_hit_tokens": ideal,
        "predicted_hit_tokens": pred,
        "engine_cached_tokens": eng,
        "ideal_hit_ratio": ideal / prompt,
        "predicted_hit_ratio": pred / prompt,
        "engine_hit_ratio": eng / prompt,
        "engine_minus_predicted_pp": 100.0 * (eng - pred) / prompt,
        "exact_share": float((gap == 0).sum()) / table.height,
        "mean_abs_gap_tokens": float(gap.abs().sum()) / table.height,
        "num_engine_above": int((gap > 0).sum()),
        "num_engine_below": int((gap < 0).sum()),
        "by_category": by_cat.to_dicts(),
        "worst": worst.to_dicts(),
    }
