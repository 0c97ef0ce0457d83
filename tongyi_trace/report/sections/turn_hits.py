"""Section: share of ideal hits consumed by single-turn vs multi-turn requests, per type (paper Fig 5).
Artifact: analysis/turn_hits.json."""

from __future__ import annotations

from tongyi_trace.report import fmt
from tongyi_trace.report.figures import labels, new_figure
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.report.sections._analysis import Analysis, analysis_builder

KINDS = [("single", "single-turn (turn 1)"), ("multi", "multi-turn (turn >= 2)")]


def fill(a: Analysis, s: Section) -> None:
    """Figures, tables and headline of the section from the artifact A."""
    h = a.headline
    by_type = a.table("by_type")
    fig = new_figure(x_title="request type", y_title="share of all ideal hits", barmode="stack")
    fig.update_yaxes(tickformat=".0%")
    for kind, name in KINDS:
        part = by_type.filter(by_type["turn_kind"] == kind)
        fig.add_bar(x=labels(part["type"].fill_null("(none)").to_list()), y=part["hit_share"].to_numpy(), name=name)
    s.figures["by_type"] = fig
    s.tables["by_type"] = Table(
        columns=["type", "turns", "requests", "block refs", "hits", "share of all hits", "hit ratio"],
        rows=[[str(r["type"]), r["turn_kind"], fmt.count(r["num_requests"]), fmt.count(r["num_blocks"]),
               fmt.count(r["num_hit_blocks"]), fmt.pct(r["hit_share"]), fmt.ratio(r["hit_ratio"])]
              for r in by_type.iter_rows(named=True)])
    s.values = {"single": fmt.pct(h.get("single_turn_hit_share")), "multi": fmt.pct(h.get("multi_turn_hit_share")),
                "single_ratio": fmt.ratio(h.get("single_turn_hit_ratio")),
                "multi_ratio": fmt.ratio(h.get("multi_turn_hit_ratio"))}
    s.headline = [Headline("share of hits from single-turn requests", s.values["single"],
                           "97% (B); A's come mostly from multi-turn")]


build = analysis_builder("turn_hits", fill)
