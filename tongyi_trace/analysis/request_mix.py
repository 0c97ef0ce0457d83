"""Request mix and turns (paper Fig 5, 9, 10; paper-notes item 2).

- Mix: requests per type and their share; per type the share of follow-up turns (turn >= 2, called
  multi-turn requests; turn 1 opens a conversation and is called single-turn).
- Turn distribution: requests per turn number, nearest-rank P50/P90 and the maximum (over requests);
  and the turn count of each conversation (its deepest turn: the paper's "turn-count distribution",
  p50 1, p90 5, max 232 in trace A), nearest-rank P50/P90 and the maximum over conversations. The two
  differ: with a share q of conversations going on to a 2nd turn and a next-turn probability P within
  multi-turn requests, P(turn >= 2) over requests exceeds one half as soon as P > 1 - q, so the paper's
  P50 of 1 with Fig 11's 0.5 / 0.8 is a P50 over conversations.
- Turn skew per user (per session when the trace has no user ids): requests per key; the top 10% of
  keys by requests send top10_turn_ratio times the average (paper: 8.9x in trace A).
Queries: request_mix_types.sql, request_mix_turns.sql, request_mix_conversations.sql,
request_mix_keys.sql.
"""

from __future__ import annotations

import polars as pl

from tongyi_trace.analysis.common import (
    AnalysisContext,
    AnalysisResult,
    absent,
    hist_quantile,
    key_label,
    ratio,
    top_share,
)

NAME = "request_mix"


def request_mix(ctx: AnalysisContext) -> AnalysisResult:
    """Request types, multi-turn shares, turn distribution and per-user (or session) turn skew."""
    res = AnalysisResult(
        NAME, "Request mix and turns", "Fig 5, 9, 10",
        "Share of requests per type; multi-turn = turn >= 2; turn percentiles are nearest-rank over "
        "requests (turn_*) and over conversations' deepest turn (conversation_turns_*); turn skew = mean "
        "requests of the top 10% users (or sessions) / mean over all.")
    has_types, has_turns = ctx.flag("has_types"), ctx.flag("has_turns")
    if not has_types and not has_turns:
        return absent(res, "the trace has no request types or turns (e.g. a Mooncake trace ingested with "
                      "--no-infer-sessions)")
    types = ctx.query("request_mix_types")
    total = int(types["num_requests"].sum())
    res.headline["num_requests"] = total
    if has_turns:
        res.headline["multi_turn_share"] = ratio(int(types["num_multi_turn_requests"].sum()), total)
    if has_types:
        types = types.with_columns(
            share=pl.col("num_requests") / total,
            multi_turn_share=pl.col("num_multi_turn_requests") / pl.col("num_requests"),
        )
        res.tables["types"] = types
        res.headline["type_share"] = dict(zip(types["type"].to_list(), types["share"].to_list(), strict=True))
        if has_turns:
            res.headline["multi_turn_share_by_type"] = dict(
                zip(types["type"].to_list(), types["multi_turn_share"].to_list(), strict=True))
    else:
        res.absent_parts["types"] = "the trace has no request types"
    if has_turns:
        turns = ctx.query("request_mix_turns")
        res.tables["turns"] = turns
        tv, tc = turns["turn"].to_list(), turns["num_requests"].to_list()
        res.headline.update(turn_p50=hist_quantile(tv, tc, 0.5), turn_p90=hist_quantile(tv, tc, 0.9),
                            turn_max=max(tv) if tv else None)
        convs = ctx.query("request_mix_conversations")
        res.tables["conversation_turns"] = convs
        cv, cc = convs["turns"].to_list(), convs["num_conversations"].to_list()
        res.headline.update(num_conversations=int(sum(cc)), conversation_turns_p50=hist_quantile(cv, cc, 0.5),
                            conversation_turns_p90=hist_quantile(cv, cc, 0.9))
    else:
        res.absent_parts["turns"] = "the trace has no turn numbers"
    kind = ctx.key_kind()
    if kind is None:
        res.absent_parts["key_turns"] = "the trace has neither user ids nor multi-request conversations"
        return res
    keys = ctx.query("request_mix_keys", use_users=kind == "user")
    res.tables["key_turns"] = keys
    kv, kc = keys["num_requests"].to_list(), keys["num_keys"].to_list()
    total_req = sum(v * c for v, c in zip(kv, kc, strict=True))
    top = top_share(list(reversed(kv)), list(reversed(kc)), 0.1 * sum(kc), total_req)
    res.headline.update(
        key_kind=kind, key_label=key_label(kind), num_keys=int(sum(kc)),
        key_requests_p50=hist_quantile(kv, kc, 0.5), key_requests_p90=hist_quantile(kv, kc, 0.9),
        key_requests_max=max(kv) if kv else None,
        top10_turn_ratio=top / 0.1 if total_req else None,
    )
    return res
