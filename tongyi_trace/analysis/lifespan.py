"""Block lifespan CDF overall and per category (paper Fig 19-20; paper-notes item 9).

A distinct prefix-chained block lives from its first access to its last reuse: lifespan_s = arrival of
the last request using it - arrival of the request that first computed it; a block never reused dies
at once (lifespan 0). Percentiles (linear interpolation) over ALL distinct blocks (the headline
P50/P90/P99, paper: A P90 612 s; B P90 0.3 s, P99 97 s) and over reused blocks only; per category of
the request that first computed the block. CDF over the same log bins as reuse_time.
Queries: chains_table.sql, lifespan.sql, lifespan_quantiles.sql.
"""

from __future__ import annotations

import polars as pl

from tongyi_trace.analysis.common import (
    BIN_MAX,
    BIN_MIN,
    BIN_ZERO,
    BINS_PER_DECADE,
    AnalysisContext,
    AnalysisResult,
)
from tongyi_trace.analysis.reuse_time import ALL, log_bin_cdf

NAME = "lifespan"
QUANTILES = (0.5, 0.9, 0.99)


def _q_names(prefix: str) -> list[str]:
    return [f"{prefix}p{round(q * 100)}_s" for q in QUANTILES]


def lifespan(ctx: AnalysisContext) -> AnalysisResult:
    """Lifespan percentiles (P50/P90/P99) and CDFs of blocks, overall and per category."""
    res = AnalysisResult(
        NAME, "Block lifespan", "Fig 19-20",
        "Time from a block's first access to its last reuse (0 when never reused), over all distinct "
        "blocks and over reused ones, per category of the request that first computed it.")
    ctx.ensure("chains")
    q = ctx.query("lifespan_quantiles", qs=list(QUANTILES))
    names, rnames = _q_names(""), _q_names("reused_")
    q = q.with_columns(
        pl.col("category").fill_null(ALL),
        *[pl.col("lifespan_q_s").list.get(i).alias(n) for i, n in enumerate(names)],
        *[pl.col("reused_lifespan_q_s").list.get(i, null_on_oob=True).alias(n) for i, n in enumerate(rnames)],
    ).drop("lifespan_q_s", "reused_lifespan_q_s")
    hist = ctx.query("lifespan", bin_zero=BIN_ZERO, bin_min=BIN_MIN, bin_max=BIN_MAX,
                     bins_per_decade=BINS_PER_DECADE)
    hist = pl.concat([hist, hist.with_columns(category=pl.lit(ALL))])
    cdf = (log_bin_cdf(hist, "category", "num_blocks")
           .join(q.select("category", pl.col("num_blocks").alias("cat_blocks")), on="category")
           .with_columns(share_of_blocks=pl.col("cum_num_blocks") / pl.col("cat_blocks")).drop("cat_blocks"))
    reused = log_bin_cdf(hist.filter(pl.col("reused")), "category", "num_blocks").rename(
        {"num_blocks": "num_reused_blocks", "cum_num_blocks": "cum_num_reused_blocks"})
    reused = (reused.join(q.select("category", pl.col("num_reused_blocks").alias("cat_reused")), on="category")
              .with_columns(share_of_reused_blocks=pl.col("cum_num_reused_blocks") / pl.col("cat_reused"))
              .drop("cat_reused"))
    res.tables["quantiles"] = q
    res.tables["cdf"] = cdf
    res.tables["reused_cdf"] = reused
    tot = q.filter(pl.col("category") == ALL).row(0, named=True)
    res.headline = {k: tot[k] for k in ["num_blocks", "num_reused_blocks", "mean_lifespan_s", *names, *rnames]}
    res.headline["by_category"] = {
        r["category"]: {k: r[k] for k in ["mean_lifespan_s", *names]}
        for r in q.filter(pl.col("category") != ALL).iter_rows(named=True)}
    return res
