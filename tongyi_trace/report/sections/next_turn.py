"""Section: probability that a request is followed by a next turn, per category and per 10-minute window
(paper Fig 11). Artifact: analysis/next_turn.json."""

from __future__ import annotations

from tongyi_trace.report import fmt
from tongyi_trace.report.figures import category_lines, label, labels, new_figure
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.report.sections._analysis import Analysis, analysis_builder


def fill(a: Analysis, s: Section) -> None:
    """Figures, tables and headline of the section from the artifact A."""
    h = a.headline
    window_min = float(h.get("window_s") or 600.0) / 60.0
    cats = a.table("categories").sort("category")
    fig = new_figure(x_title="category", y_title="next-turn probability", barmode="group")
    fig.update_yaxes(range=[0, 1], tickformat=".0%")
    x = labels(cats["category"].to_list())
    fig.add_bar(x=x, y=cats["next_turn_prob"].to_numpy(), name="next turn at all")
    fig.add_bar(x=x, y=cats["next_turn_prob_in_window"].to_numpy(), name=f"next turn within {window_min:g} min")
    s.figures["categories"] = fig
    win = a.table("windows").sort(["category", "window_start_s"])
    fig = new_figure(x_title="window start (min from trace start)", y_title="next-turn probability in window")
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    styles = category_lines(win["category"].unique(maintain_order=True).to_list(), all_label="")
    for (cat,), part in win.group_by(["category"], maintain_order=True):
        fig.add_scatter(x=part["window_start_s"].to_numpy() / 60.0, y=part["next_turn_prob_in_window"].to_numpy(),
                        mode="lines+markers", name=label(cat), line=styles[cat], marker={"size": 4})
    s.figures["windows"] = fig
    s.tables["categories"] = Table(
        columns=["category", "requests", "with a next turn", f"within {window_min:g} min", "probability",
                 f"probability within {window_min:g} min"],
        rows=[[str(r["category"]), fmt.count(r["num_requests"]), fmt.count(r["num_with_next"]),
               fmt.count(r["num_with_next_in_window"]), fmt.ratio(r["next_turn_prob"], 3),
               fmt.ratio(r["next_turn_prob_in_window"], 3)] for r in cats.iter_rows(named=True)])
    s.values = {"window_min": f"{window_min:g}", "single": fmt.ratio(h.get("single_turn_next_prob_in_window"), 2),
                "multi": fmt.ratio(h.get("multi_turn_next_prob_in_window"), 2),
                "all": fmt.ratio(h.get("next_turn_prob"), 2)}
    s.headline = [Headline(f"next-turn probability within {window_min:g} min: after turn 1 / within "
                           "a conversation", f"{s.values['single']} / {s.values['multi']}", "~0.5 / ~0.8")]


build = analysis_builder("next_turn", fill)
