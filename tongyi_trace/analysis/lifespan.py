"""Block lifespan CDF overall and per category (paper Fig 19-20; paper-notes item 9).

A distinct prefix-chained block lives from its first access to its last reuse: lifespan_s = arrival of
the last request using it - arrival of the request that first computed it; a block never reused dies
at once (lifespan 0). Percentiles (linear interpolation) over ALL distinct blocks (the headline
P50/P90/P99, paper: A P90 612 s; B P90 0.3 s, P99 97 s) and over reused blocks only; per category of
the request that first computed the block. CDF over the same log bins as reuse_time.
Queries: chains_table.sql, lifespan.sql, lifespan_values.sql (the percentiles interpolated from its exact
histogram, as lifespan_quantiles.sql, the reference, computes them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
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
    q = lifespan_quantiles(ctx.query("lifespan_values"), QUANTILES)
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


def quantile_cont(values: npt.NDArray[np.float64], counts: npt.NDArray[np.int64], q: float) -> float:
    """DuckDB's quantile_cont(x, Q) over the values VALUES (ascending, distinct) each repeated COUNTS times.

    With x sorted, rn = (n - 1) Q and d = rn - floor(rn): x[floor(rn)] (1 - d) + x[ceil(rn)] d, computed as
    DuckDB's build computes it, the first product and the sum in one rounding (a fused multiply-add), so
    the result is DuckDB's to the bit (tests/study/test_analyze_partitioned.py holds the two equal)."""
    cum = np.cumsum(counts)
    rn = float(cum[-1] - 1) * q
    lo, hi = math.floor(rn), math.ceil(rn)
    v_lo = float(values[int(np.searchsorted(cum, lo, side="right"))])
    if hi == lo:
        return v_lo
    v_hi = float(values[int(np.searchsorted(cum, hi, side="right"))])
    d = rn - lo
    return float(Fraction(v_lo) * Fraction(1.0 - d) + Fraction(v_hi * d))


def lifespan_quantiles(values: pl.DataFrame, qs: Sequence[float]) -> pl.DataFrame:
    """lifespan_quantiles.sql's rows (its reference; tests/analysis/test_lifespan_quantiles.py holds the two
    equal) from the histogram of exact lifespans VALUES (lifespan_values.sql): DuckDB's group-by spills, where
    quantile_cont over every block holds all their lifespans at once (out of memory at 30x the to-C trace)."""
    rows: list[dict[str, Any]] = []
    cats: list[str | None] = [None, *sorted(values["category"].unique().to_list())]
    for cat in cats:
        h = values if cat is None else values.filter(pl.col("category") == cat)
        h = h.group_by("reused", "lifespan_s", "lifespan_us").agg(pl.col("num_blocks").sum()).sort("lifespan_s")
        every = h.group_by("lifespan_s", "lifespan_us", maintain_order=True).agg(pl.col("num_blocks").sum())
        reused = h.filter(pl.col("reused"))
        v, c = every["lifespan_s"].to_numpy(), every["num_blocks"].to_numpy()
        rv, rc = reused["lifespan_s"].to_numpy(), reused["num_blocks"].to_numpy()
        n = int(c.sum())
        sum_us = sum(int(u) * int(k) for u, k in zip(every["lifespan_us"].to_list(), c.tolist(), strict=True))
        rows.append({
            "category": cat, "num_blocks": n, "num_reused_blocks": int(rc.sum()),
            "mean_lifespan_s": float(sum_us) / 1e6 / n if n else None,  # as lifespan_quantiles.sql
            "lifespan_q_s": [quantile_cont(v, c, q) for q in qs] if n else None,
            "reused_lifespan_q_s": [quantile_cont(rv, rc, q) for q in qs] if rc.size else None,
        })
    return pl.DataFrame(rows, schema={"category": pl.Utf8, "num_blocks": pl.Int64, "num_reused_blocks": pl.Int64,
                                      "mean_lifespan_s": pl.Float64, "lifespan_q_s": pl.List(pl.Float64),
                                      "reused_lifespan_q_s": pl.List(pl.Float64)})
