"""Per-request KV-cache size relative to HBM (paper Fig 21; paper-notes item 10).

A request keeps tokens x kv_bytes_per_token bytes of KV cache, with kv_bytes_per_token =
2 x layers x kv_heads x head_dim x dtype bytes (Qwen2-7B: 0.875 MiB per 16 tokens) and HBM for KV =
tp x GPU memory x utilization - weights - tp x activation reserve (tongyi_trace/models.py). For each
model: the distribution (nearest-rank percentiles) of the prompt's KV bytes and of prompt + output,
each also as a fraction of the model's HBM for KV.
Query: kv_size.sql.
"""

from __future__ import annotations

import polars as pl

from tongyi_trace.analysis.common import AnalysisContext, AnalysisResult, model_record

NAME = "kv_size"
PERCENTS = list(range(101))
MIB = 1024**2


def kv_size(ctx: AnalysisContext) -> AnalysisResult:
    """Per-request KV bytes (prompt, prompt + output) and their ratio to HBM, for each model preset."""
    res = AnalysisResult(
        NAME, "Per-request KV size vs HBM", "Fig 21",
        "KV bytes of a request = tokens x 2 x layers x KV heads x head dim x dtype bytes; shown as "
        "percentiles over requests and as a fraction of the HBM left for KV.")
    row = ctx.query("kv_size", qs=[p / 100 for p in PERCENTS]).row(0, named=True)
    frames = []
    models = {}
    for m in ctx.options.models:
        bpt, hbm = m.kv_bytes_per_token, m.hbm_kv_bytes
        inp = [t * bpt for t in row["input_tokens_q"] or []]
        tot = [t * bpt for t in row["total_tokens_q"] or []]
        frames.append(pl.DataFrame({
            "model": [m.name] * len(inp), "percentile": PERCENTS[:len(inp)],
            "input_kv_bytes": inp, "total_kv_bytes": tot,
            "input_x_hbm": [b / hbm for b in inp], "total_x_hbm": [b / hbm for b in tot],
        }))
        rec = model_record(m, ctx.block_size)
        rec["mib_per_16_tokens"] = bpt * 16 / MIB
        if tot:
            rec.update(total_kv_p50_bytes=tot[50], total_kv_p99_bytes=tot[99], total_kv_max_bytes=tot[100],
                       total_p50_x_hbm=tot[50] / hbm, total_p99_x_hbm=tot[99] / hbm,
                       total_max_x_hbm=tot[100] / hbm, input_p99_x_hbm=inp[99] / hbm)
        models[m.name] = rec
    res.tables["percentiles"] = pl.concat(frames) if frames else pl.DataFrame()
    res.headline = {"num_requests": row["num_requests"], "max_total_tokens": row["max_total_tokens"],
                    "models": models}
    return res
