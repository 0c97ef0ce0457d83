"""Reuse skew over blocks and over users (paper Fig 7, 8; paper-notes item 5).

- Blocks: reuses of a distinct prefix-chained block = its references - 1. top10_block_reuse_share =
  share of all reuses made by the 10% of distinct blocks reused most (paper: 77%). Also over reused
  blocks only. Curve: share of reuses vs share of blocks (most reused first).
- Users (sessions when the trace has no user ids): ideal prefix hits per consumer key.
  key_share_for_90pct_hits = smallest share of keys, most hits first, that together receive 90% of all
  hits (paper: 19% of users in A, 4% in B). Curve: share of hits vs share of keys.
Queries: skew_blocks.sql (over chains_table.sql), skew_keys.sql (over req_hits_table.sql).
"""

from __future__ import annotations

from tongyi_trace.analysis.common import (
    NO_KEYS_REASON,
    AnalysisContext,
    AnalysisResult,
    items_for_share,
    key_label,
    lorenz,
    ratio,
    top_share,
)

NAME = "skew"


def skew(ctx: AnalysisContext) -> AnalysisResult:
    """Share of reuses from the top 10% of blocks, and share of users (or sessions) giving 90% of hits."""
    res = AnalysisResult(
        NAME, "Reuse skew over blocks and users", "Fig 7, 8",
        "Top-10% blocks' share of all reuses (reuses = references - 1); smallest share of users "
        "(or sessions), most hits first, receiving 90% of ideal prefix hits.")
    ctx.ensure("req_hits")
    blocks = ctx.query("skew_blocks")
    bv, bc = blocks["num_reuses"].to_list(), blocks["num_blocks"].to_list()
    num_blocks = sum(bc)
    num_reuses = sum(v * c for v, c in zip(bv, bc, strict=True))
    num_reused = sum(c for v, c in zip(bv, bc, strict=True) if v > 0)
    res.tables["blocks"] = blocks
    res.tables["blocks_curve"] = lorenz(blocks, "num_reuses", "num_blocks")
    res.headline = {
        "num_distinct_blocks": num_blocks,
        "num_reused_blocks": num_reused,
        "num_reuses": num_reuses,
        "top10_block_reuse_share": top_share(bv, bc, 0.1 * num_blocks, num_reuses) if num_reuses else None,
        "top10_reused_block_reuse_share": (top_share(bv, bc, 0.1 * num_reused, num_reuses)
                                           if num_reuses else None),
    }
    kind = ctx.key_kind()
    if kind is None:
        res.absent_parts["keys"] = NO_KEYS_REASON
        return res
    keys = ctx.query("skew_keys", use_users=kind == "user")
    kv, kc = keys["num_hits"].to_list(), keys["num_keys"].to_list()
    num_keys = sum(kc)
    res.tables["keys"] = keys
    res.tables["keys_curve"] = lorenz(keys, "num_hits", "num_keys")
    res.headline.update(
        key_kind=kind, key_label=key_label(kind), num_keys=num_keys,
        key_share_for_90pct_hits=ratio(items_for_share(kv, kc, 0.9), num_keys)
        if sum(v * c for v, c in zip(kv, kc, strict=True)) else None,
    )
    return res
