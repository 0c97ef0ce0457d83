"""Ideal prefix hit ratio (paper Fig 4, paper-notes item 1).

With an infinite cache, a block reference is a hit when an earlier request already computed the same
prefix-chained block (the whole prefix up to and including it is equal). Reported over blocks,
over tokens (hit blocks weighted by the tokens they hold), per request type and per category, and,
for contrast, the non-prefix "content" variant that counts a reference as a hit whenever its
block_id appeared in any earlier request at any position (what a position-free cache would claim).
Queries: chains_table.sql, req_hits_table.sql, hit_ratio.sql.
"""

from __future__ import annotations

import polars as pl

from tongyi_trace.analysis.common import AnalysisContext, AnalysisResult, ratio

NAME = "hit_ratio"
_SUMS = ["num_requests", "num_blocks", "num_hit_blocks", "num_tokens", "num_hit_tokens",
         "num_content_hit_blocks"]


def _with_ratios(df: pl.DataFrame) -> pl.DataFrame:
    den_b = pl.when(pl.col("num_blocks") > 0).then(pl.col("num_blocks"))
    den_t = pl.when(pl.col("num_tokens") > 0).then(pl.col("num_tokens"))
    return df.with_columns(
        hit_ratio=pl.col("num_hit_blocks") / den_b,
        token_hit_ratio=pl.col("num_hit_tokens") / den_t,
        content_hit_ratio=pl.col("num_content_hit_blocks") / den_b,
    )


def hit_ratio(ctx: AnalysisContext) -> AnalysisResult:
    """Ideal (infinite-cache) prefix hit ratio overall, per type and per category, plus variants."""
    res = AnalysisResult(
        NAME, "Ideal prefix hit ratio", "Fig 4",
        "Infinite cache: share of block references whose prefix-chained block an earlier request "
        "computed; token-level weights blocks by their tokens; the content variant matches block ids "
        "at any position (no prefix rule).")
    ctx.ensure("req_hits")
    by_cat = ctx.query("hit_ratio")
    tot = by_cat.select(pl.col(_SUMS).sum()).row(0, named=True)
    res.headline = {
        "hit_ratio": ratio(tot["num_hit_blocks"], tot["num_blocks"]),
        "token_hit_ratio": ratio(tot["num_hit_tokens"], tot["num_tokens"]),
        "content_hit_ratio": ratio(tot["num_content_hit_blocks"], tot["num_blocks"]),
        "num_block_refs": int(tot["num_blocks"]),
        "num_hit_blocks": int(tot["num_hit_blocks"]),
        "num_requests": int(tot["num_requests"]),
    }
    cat = _with_ratios(by_cat)
    res.headline["by_category"] = dict(zip(cat["category"].to_list(), cat["hit_ratio"].to_list(), strict=True))
    res.tables["by_category"] = cat
    if ctx.flag("has_types"):
        by_type = _with_ratios(by_cat.group_by("type").agg(pl.col(_SUMS).sum()).sort("num_blocks", descending=True))
        res.tables["by_type"] = by_type
        res.headline["by_type"] = dict(zip(by_type["type"].to_list(), by_type["hit_ratio"].to_list(),
                                           strict=True))
    else:
        res.absent_parts["by_type"] = "the trace has no request types (e.g. Mooncake format)"
    return res
