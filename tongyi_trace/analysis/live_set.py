"""Capacity an oracle needs: the live set over time (paper Fig 22; paper-notes item 11).

After each request, the live set holds the blocks already computed that a later request will reuse:
block b is live from its first access (request first_req) until its last reuse (request last_req),
i.e. for first_req <= req_idx < last_req; blocks never reused are never live. Keeping exactly the live
set achieves the ideal hit ratio, so its peak is the cache an oracle needs. Reported in blocks, in bytes
(x full-block KV bytes of each model) and x HBM for KV (paper: trace A on Llama3-70B ~4x HBM).
The time series keeps, per time bucket, the largest live set seen in it (at most ~2000 points), and that
size x HBM for each model (column x_hbm_<model name>).
Queries: chains_table.sql, live_deltas.sql, live_set.sql.
"""

from __future__ import annotations

import math

import polars as pl

from tongyi_trace.analysis.common import AnalysisContext, AnalysisResult

NAME = "live_set"
MAX_POINTS = 2000


def live_set(ctx: AnalysisContext) -> AnalysisResult:
    """Oracle live-set size after each request, downsampled over time, and its peak in blocks/bytes/xHBM."""
    res = AnalysisResult(
        NAME, "Oracle live set (capacity for the ideal hit ratio)", "Fig 22",
        "Blocks already computed that a later request reuses, after each request; its peak is the cache "
        "an oracle needs to reach the ideal hit ratio.")
    ctx.ensure("live_deltas")
    series = ctx.query("live_set")
    if series.height == 0:
        res.headline = {"peak_live_blocks": 0}
        return res
    peak_idx = int(series["num_live_blocks"].arg_max() or 0)
    peak = series.row(peak_idx, named=True)
    t0, t1 = float(series["arrival_s"].min()), float(series["arrival_s"].max())  # type: ignore[arg-type]
    bucket_s = max((t1 - t0) / MAX_POINTS, 1e-9)
    ts = (series.with_columns(bucket=((pl.col("arrival_s") - t0) / bucket_s).floor().cast(pl.Int64))
          .group_by("bucket").agg(time_s=pl.col("arrival_s").min(), num_live_blocks=pl.col("num_live_blocks").max())
          .sort("bucket").drop("bucket"))
    cols = {}
    models = {}
    for m in ctx.options.models:
        block_bytes = m.kv_bytes_per_block(ctx.block_size)
        hbm = m.hbm_kv_bytes
        cols[f"x_hbm_{m.name}"] = pl.col("num_live_blocks") * block_bytes / hbm
        peak_bytes = int(peak["num_live_blocks"]) * block_bytes
        models[m.name] = {"kv_bytes_per_block": block_bytes, "hbm_kv_bytes": hbm,
                          "peak_bytes": peak_bytes, "peak_x_hbm": peak_bytes / hbm,
                          "hbm_blocks": m.hbm_blocks(ctx.block_size)}
    res.tables["timeseries"] = ts.with_columns(**cols)
    res.headline = {
        "peak_live_blocks": int(peak["num_live_blocks"]),
        "peak_time_s": float(peak["arrival_s"]),
        "peak_req_idx": int(peak["req_idx"]),
        "mean_live_blocks": float(series["num_live_blocks"].mean() or 0.0),  # type: ignore[arg-type]
        "bucket_s": bucket_s if math.isfinite(bucket_s) else None,
        "models": models,
    }
    return res
