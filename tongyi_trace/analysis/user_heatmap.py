"""Cross-user reuse: producer x consumer hit heatmap (paper Fig 6; paper-notes item 4).

Every ideal prefix hit is credited to a (producer, consumer) pair: the consumer is the user of the
request that hits, the producer the user of the request that first computed the block. The heatmap
covers the top-N keys by hits consumed (the rest pooled as "(other)"); diagonal_share = hits whose
producer is the consumer itself / all hits (over every key, not only the top N). Public traces have
no user id: the key then falls back to the session (conversation root), and the result says so.
Query: user_heatmap.sql (over chains_table.sql).
"""

from __future__ import annotations

import polars as pl

from tongyi_trace.analysis.common import (
    NO_KEYS_REASON,
    AnalysisContext,
    AnalysisResult,
    absent,
    key_label,
    ratio,
)

NAME = "user_heatmap"
OTHER = "(other)"


def user_heatmap(ctx: AnalysisContext) -> AnalysisResult:
    """Producer x consumer ideal-hit matrix over the top users (or sessions) and its diagonal share."""
    res = AnalysisResult(
        NAME, "Cross-user reuse (producer x consumer)", "Fig 6",
        "Hits credited to (user who first computed the block, user whose request hit); diagonal share "
        "= hits on a user's own blocks / all hits. Sessions stand in for users when there are none.")
    kind = ctx.key_kind()
    if kind is None:
        return absent(res, NO_KEYS_REASON)
    ctx.ensure("chains")
    pairs = ctx.query("user_heatmap", use_users=kind == "user").with_columns(
        pl.col("producer").fill_null("(none)"), pl.col("consumer").fill_null("(none)"))
    total = int(pairs["num_hits"].sum())
    diag = int(pairs.filter(pl.col("producer") == pl.col("consumer"))["num_hits"].sum())
    consumed = (pairs.group_by("consumer").agg(pl.col("num_hits").sum())
                .sort(["num_hits", "consumer"], descending=[True, False]))
    top = consumed["consumer"].head(ctx.options.top_n).to_list()
    in_top = pl.col("producer").is_in(top), pl.col("consumer").is_in(top)
    matrix = (pairs.with_columns(
        producer=pl.when(in_top[0]).then(pl.col("producer")).otherwise(pl.lit(OTHER)),
        consumer=pl.when(in_top[1]).then(pl.col("consumer")).otherwise(pl.lit(OTHER)))
        .group_by("producer", "consumer").agg(pl.col("num_hits").sum())
        .with_columns(share=pl.col("num_hits") / total if total else pl.lit(None, pl.Float64)))
    order = {k: i for i, k in enumerate([*top, OTHER])}
    matrix = (matrix.with_columns(producer_rank=pl.col("producer").replace_strict(order, return_dtype=pl.Int64),
                                  consumer_rank=pl.col("consumer").replace_strict(order, return_dtype=pl.Int64))
              .sort("consumer_rank", "producer_rank"))
    top_hits = matrix.filter(pl.col("producer") != OTHER, pl.col("consumer") != OTHER)
    top_total = int(top_hits["num_hits"].sum())
    res.tables["matrix"] = matrix
    res.headline = {
        "key_kind": kind,
        "key_label": key_label(kind),
        "num_hits": total,
        "diagonal_share": ratio(diag, total),
        "num_keys_with_hits": consumed.height,
        "top_n": len(top),
        "top_diagonal_share": ratio(int(top_hits.filter(pl.col("producer") == pl.col("consumer"))["num_hits"]
                                        .sum()), top_total),
    }
    return res
