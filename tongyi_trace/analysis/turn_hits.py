"""Single- vs multi-turn contribution to ideal hits (paper Fig 5; paper-notes item 3).

Of all ideal prefix hits (hit_ratio's definition), the share earned by single-turn requests
(turn = 1: the first request of a conversation, which can only hit on other conversations' prefixes,
e.g. shared system prompts) and by multi-turn requests (turn >= 2: follow-ups, which mostly hit on
their own conversation's history). Paper: trace B's hits are 97% single-turn; A's mostly multi-turn.
Query: turn_hits.sql (over req_hits_table.sql).
"""

from __future__ import annotations

import polars as pl

from tongyi_trace.analysis.common import AnalysisContext, AnalysisResult, absent, ratio

NAME = "turn_hits"


def turn_hits(ctx: AnalysisContext) -> AnalysisResult:
    """Share of ideal hits from single-turn (turn 1) and multi-turn (turn >= 2) requests, overall and per type."""
    res = AnalysisResult(
        NAME, "Hits from single- vs multi-turn requests", "Fig 5",
        "Share of all ideal prefix hits whose consumer request is single-turn (turn = 1) or "
        "multi-turn (turn >= 2).")
    if not ctx.flag("has_turns"):
        return absent(res, "the trace has no turn numbers (e.g. a Mooncake trace ingested with --no-infer-sessions)")
    ctx.ensure("req_hits")
    df = ctx.query("turn_hits")
    total_hits = int(df["num_hit_blocks"].sum())
    by_kind = df.group_by("turn_kind").agg(pl.col("num_requests", "num_blocks", "num_hit_blocks").sum())
    hits = dict(zip(by_kind["turn_kind"].to_list(), by_kind["num_hit_blocks"].to_list(), strict=True))
    blocks = dict(zip(by_kind["turn_kind"].to_list(), by_kind["num_blocks"].to_list(), strict=True))
    res.headline = {
        "num_hit_blocks": total_hits,
        "single_turn_hit_share": ratio(hits.get("single", 0), total_hits),
        "multi_turn_hit_share": ratio(hits.get("multi", 0), total_hits),
        "single_turn_hit_ratio": ratio(hits.get("single", 0), blocks.get("single", 0)),
        "multi_turn_hit_ratio": ratio(hits.get("multi", 0), blocks.get("multi", 0)),
    }
    res.tables["by_type"] = df.with_columns(
        hit_share=pl.col("num_hit_blocks") / total_hits if total_hits else pl.lit(None, pl.Float64),
        hit_ratio=pl.col("num_hit_blocks") / pl.when(pl.col("num_blocks") > 0).then(pl.col("num_blocks")),
    )
    return res
