"""Section: reuse skew, as concentration curves: share of reuses held by the top x% of blocks, and of
ideal hits received by the top x% of users or sessions (paper Fig 7, 8). Artifact: analysis/skew.json."""

from __future__ import annotations

from tongyi_trace.report import fmt
from tongyi_trace.report.figures import new_figure
from tongyi_trace.report.model import Headline, Section
from tongyi_trace.report.sections._analysis import Analysis, analysis_builder


def fill(a: Analysis, s: Section) -> None:
    """Figures, tables and headline of the section from the artifact A."""
    h = a.headline
    key_label = str(h.get("key_label") or "users")
    curves = [("blocks_curve", "blocks, most reused first (share of reuses)")]
    if a.has_table("keys_curve"):
        curves.append(("keys_curve", f"{key_label}, most hits first (share of ideal hits)"))
    fig = new_figure(x_title="top share of items", y_title="share of the total")
    fig.update_xaxes(tickformat=".0%", range=[0, 1])
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02])
    fig.add_scatter(x=[0, 1], y=[0, 1], mode="lines", name="no skew", line={"dash": "dot", "color": "#999"})
    for key, name in curves:
        c = a.table(key)
        fig.add_scatter(x=c["share_items"].to_numpy(), y=c["share_value"].to_numpy(), mode="lines", name=name)
    s.figures["curves"] = fig
    s.values = {"key_label": key_label, "top10": fmt.pct(h.get("top10_block_reuse_share")),
                "top10_reused": fmt.pct(h.get("top10_reused_block_reuse_share")),
                "num_reused_blocks": fmt.count(h.get("num_reused_blocks")),
                "num_distinct_blocks": fmt.count(h.get("num_distinct_blocks")),
                "keys_90": fmt.pct(h.get("key_share_for_90pct_hits")) if a.has_table("keys_curve") else None}
    s.headline = [Headline("reuses from the top 10% of blocks", s.values["top10"], "77%")]
    if s.values["keys_90"] is not None:
        s.headline.append(Headline(f"share of {key_label} receiving 90% of hits", s.values["keys_90"],
                                   "19% (A) / 4% (B) of users"))


build = analysis_builder("skew", fill)
