"""Next-turn probability per category in time windows (paper Fig 11; paper-notes item 7).

A request has a next turn when a later request names it as parent (parent_chat_id). Per window of
window_s seconds (default 10 min, by arrival) and category: the share of requests followed by a next
turn at all (next_turn_prob) and within window_s of their arrival (next_turn_prob_in_window).
Headline: per category and for single-turn (turn 1) vs multi-turn (turn >= 2) requests (paper:
about 0.5 after a single-turn request, 0.8 within multi-turn conversations). Requests near the end
of the trace are right-censored (their next turn may fall after it).
Query: next_turn.sql.
"""

from __future__ import annotations

import polars as pl

from tongyi_trace.analysis.common import AnalysisContext, AnalysisResult, absent, ratio

NAME = "next_turn"
_SUMS = ["num_requests", "num_with_next", "num_with_next_in_window"]


def _probs(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(next_turn_prob=pl.col("num_with_next") / pl.col("num_requests"),
                           next_turn_prob_in_window=pl.col("num_with_next_in_window") / pl.col("num_requests"))


def next_turn(ctx: AnalysisContext) -> AnalysisResult:
    """Probability that a request gets a next turn, per category, per time window and per turn kind."""
    w = ctx.options.window_s
    res = AnalysisResult(
        NAME, "Next-turn probability", "Fig 11",
        f"Share of requests that a later request names as parent (a next turn), at all and within "
        f"{w:g} s, per category and per {w:g}-s window of arrival.")
    if not ctx.flag("has_sessions"):
        return absent(res, "the trace has no conversations (no request names a parent), e.g. a Mooncake "
                      "trace ingested with --no-infer-sessions")
    df = ctx.query("next_turn", window_s=w)
    windows = _probs(df.group_by("window_idx", "category").agg(pl.col(_SUMS).sum())
                     .with_columns(window_start_s=pl.col("window_idx") * w).sort("window_idx", "category"))
    cats = _probs(df.group_by("category").agg(pl.col(_SUMS).sum()).sort("category"))
    res.tables["windows"] = windows
    res.tables["categories"] = cats
    tot = df.select(pl.col(_SUMS).sum()).row(0, named=True)
    res.headline = {
        "window_s": w,
        "next_turn_prob": ratio(tot["num_with_next"], tot["num_requests"]),
        "next_turn_prob_in_window": ratio(tot["num_with_next_in_window"], tot["num_requests"]),
        "by_category": dict(zip(cats["category"].to_list(), cats["next_turn_prob"].to_list(), strict=True)),
    }
    if ctx.flag("has_turns"):
        kinds = df.group_by("turn_kind").agg(pl.col(_SUMS).sum())
        for row in kinds.iter_rows(named=True):
            if row["turn_kind"] is not None:
                res.headline[f"{row['turn_kind']}_turn_next_prob"] = ratio(row["num_with_next"],
                                                                           row["num_requests"])
                res.headline[f"{row['turn_kind']}_turn_next_prob_in_window"] = ratio(
                    row["num_with_next_in_window"], row["num_requests"])
    else:
        res.absent_parts["turn_kind"] = "the trace has no turn numbers"
    return res
