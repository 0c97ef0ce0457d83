"""Reuse-time distribution overall and per category (paper Fig 12-15; paper-notes item 6).

For every block access, its reuse time is the time until the next access of the same prefix-chained
block by a later request (none when it is never accessed again): the view reuse_events
(queries/reuse_events.sql, shared with `kvtrace fit`). Per category w of the ACCESSING request:
- prob_reused_within(d) = accesses reused within d / all accesses: the curve F_w(d) that the
  workload-aware policy fits as p_w (1 - exp(-lambda_w d)) (it plateaus at p_w = reuse probability);
- share_of_reuses_within(d) = reuses within d / all reuses (the reuse-time CDF of Fig 12).
d runs over log bins (10 per decade, 1 ms .. 10^6 s); the 10 s and 10 min shares are exact.
Paper: 80% of reuses within 10 min (trace A) and within 10 s (trace B).
The summed reuse times (all, and after 10 min) are the block-seconds the reused blocks wait: the
time integral of the oracle's live set (live_set.py), so their sum over the duration is its time
average, and the part after 10 min is what the long reuses cost in cache (docs/synth.md). They are summed
in whole microseconds (exact integer sums, equal in any order and over any partitioning).
Queries: reuse_events.sql, reuse_time.sql.
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
    bin_upper_s,
    ratio,
)
from tongyi_trace.schemas import ALL_CATEGORIES as ALL

NAME = "reuse_time"
SHORT_S = 10.0
LONG_S = 600.0
US_PER_S = 1e6  # reuse times are summed in whole microseconds (reuse_time.sql)


def log_bin_cdf(hist: pl.DataFrame, group: str, count: str) -> pl.DataFrame:
    """Cumulative counts per GROUP over log bins: columns GROUP, bin, upper_s, COUNT, cum_COUNT.

    Rows with a null bin are dropped (they are outside the distribution, e.g. never reused)."""
    h = hist.filter(pl.col("bin").is_not_null()).group_by(group, "bin").agg(pl.col(count).sum()).sort(group, "bin")
    return h.with_columns(
        upper_s=pl.col("bin").map_elements(bin_upper_s, return_dtype=pl.Float64),
        **{f"cum_{count}": pl.col(count).cum_sum().over(group)},
    )


def reuse_time(ctx: AnalysisContext) -> AnalysisResult:
    """Reuse-time CDFs overall and per category; shares of reuses within 10 s and 10 min."""
    res = AnalysisResult(
        NAME, "Reuse time", "Fig 12-15",
        "Time from a block access to the next access of the same prefix-chained block; per category of "
        "the accessing request: probability of reuse within d (F_w(d)) and CDF over reuses.")
    ctx.ensure("reuse_events")
    raw = ctx.query("reuse_time", bin_zero=BIN_ZERO, bin_min=BIN_MIN, bin_max=BIN_MAX,
                    bins_per_decade=BINS_PER_DECADE, short_s=SHORT_S, long_s=LONG_S)
    raw = pl.concat([raw, raw.with_columns(category=pl.lit(ALL))])
    per_cat = raw.group_by("category").agg(
        num_accesses=pl.col("num_accesses").sum(),
        num_reuses=pl.col("num_accesses").filter(pl.col("bin").is_not_null()).sum(),
        num_within_10s=pl.col("num_within_short").sum(),
        num_within_600s=pl.col("num_within_long").sum(),
        sum_reuse_time_s=pl.col("reuse_us").sum() / US_PER_S,  # exact integer sums, one division
        sum_reuse_time_after_600s_s=pl.col("reuse_us_after_long").sum() / US_PER_S,
    ).with_columns(
        reuse_prob=pl.col("num_reuses") / pl.col("num_accesses"),
        share_within_10s=pl.col("num_within_10s") / pl.when(pl.col("num_reuses") > 0).then(pl.col("num_reuses")),
        share_within_600s=pl.col("num_within_600s") / pl.when(pl.col("num_reuses") > 0).then(pl.col("num_reuses")),
    ).sort("category")
    cdf = (log_bin_cdf(raw.rename({"num_accesses": "num_reuses"}), "category", "num_reuses")
           .join(per_cat.select("category", pl.col("num_accesses").alias("cat_accesses"),
                                pl.col("num_reuses").alias("cat_reuses")), on="category")
           .with_columns(prob_reused_within=pl.col("cum_num_reuses") / pl.col("cat_accesses"),
                         share_of_reuses_within=pl.col("cum_num_reuses") / pl.col("cat_reuses"))
           .drop("cat_accesses", "cat_reuses"))
    res.tables["categories"] = per_cat
    res.tables["cdf"] = cdf
    tot = per_cat.filter(pl.col("category") == ALL).row(0, named=True)
    cats = per_cat.filter(pl.col("category") != ALL)
    total_s, after_s = float(tot["sum_reuse_time_s"]), float(tot["sum_reuse_time_after_600s_s"])
    res.headline = {
        "num_accesses": tot["num_accesses"],
        "num_reuses": tot["num_reuses"],
        "reuse_prob": ratio(tot["num_reuses"], tot["num_accesses"]),
        "share_within_10s": tot["share_within_10s"],
        "share_within_600s": tot["share_within_600s"],
        "sum_reuse_time_s": total_s,
        "sum_reuse_time_after_600s_s": after_s,
        "mean_reuse_time_s": ratio(total_s, tot["num_reuses"]),
        "mean_reuse_time_after_600s_s": ratio(after_s, tot["num_reuses"] - tot["num_within_600s"]),
        "by_category": {r["category"]: {"reuse_prob": r["reuse_prob"], "share_within_10s": r["share_within_10s"],
                                        "share_within_600s": r["share_within_600s"]}
                        for r in cats.iter_rows(named=True)},
    }
    return res
