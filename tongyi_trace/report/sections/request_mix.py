"""Section: request mix by type, multi-turn share, turn distribution and per-user (or per-session) turn
skew (paper Fig 5, 9, 10). Artifact: analysis/request_mix.json."""

from __future__ import annotations

import polars as pl

from tongyi_trace.report import fmt
from tongyi_trace.report.figures import Fig, labels, new_figure
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.report.sections._analysis import Analysis, analysis_builder


def fill(a: Analysis, s: Section) -> None:
    """Figures, tables and headline of the section from the artifact A."""
    h = a.headline
    key_label = str(h.get("key_label") or "users")
    if a.has_table("types"):
        types = a.table("types")
        s.figures["types"] = _types_figure(types)
        s.tables["types"] = Table(
            columns=["type", "requests", "share", "follow-up turns (turn >= 2)", "multi-turn share"],
            rows=[[str(r["type"]), fmt.count(r["num_requests"]), fmt.pct(r["share"]),
                   fmt.count(r["num_multi_turn_requests"]), fmt.pct(r["multi_turn_share"])]
                  for r in types.iter_rows(named=True)])
    if a.has_table("turns"):
        turns = a.table("turns")
        fig = new_figure(x_title="turn number (log)", y_title="requests at that turn / conversations ending there")
        fig.update_xaxes(type="log")  # turns 1-20 carry the data; a linear axis to the deepest turn hides them
        fig.update_yaxes(type="log")
        fig.add_bar(x=turns["turn"].to_numpy(), y=turns["num_requests"].to_numpy(), name="requests")
        if a.has_table("conversation_turns"):
            convs = a.table("conversation_turns")
            fig.add_bar(x=convs["turns"].to_numpy(), y=convs["num_conversations"].to_numpy(),
                        name="conversations (deepest turn)")
        s.figures["turns"] = fig
    if a.has_table("key_turns"):
        kt = a.table("key_turns")
        fig = new_figure(x_title=f"requests per {key_label.rstrip('s')}", y_title=key_label)
        fig.update_xaxes(type="log")
        fig.update_yaxes(type="log")
        fig.add_scatter(x=kt["num_requests"].to_numpy(), y=kt["num_keys"].to_numpy(), mode="markers",
                        name=key_label)
        s.figures["key_turns"] = fig
    s.values = {"key_label": key_label, "multi_turn_share": fmt.pct(h.get("multi_turn_share")),
                "turn_p50": fmt.num(h.get("turn_p50")), "turn_p90": fmt.num(h.get("turn_p90")),
                "turn_max": fmt.count(h.get("turn_max")), "top10_turn_ratio": fmt.num(h.get("top10_turn_ratio")),
                "conversation_turns_p50": fmt.num(h.get("conversation_turns_p50")),
                "conversation_turns_p90": fmt.num(h.get("conversation_turns_p90")),
                "num_keys": fmt.count(h.get("num_keys"))}
    s.headline = [
        Headline("multi-turn share of requests", fmt.pct(h.get("multi_turn_share")),
                 "~50% of non-image (A), <0.1% (B)"),
        Headline("turns per conversation P50 / P90 / max", f"{s.values['conversation_turns_p50']} / "
                 f"{s.values['conversation_turns_p90']} / {s.values['turn_max']}", "1 / 5 / 232 (A)"),
        Headline("turn number of requests P50 / P90", f"{s.values['turn_p50']} / {s.values['turn_p90']}", ""),
        Headline(f"top-10% {key_label}: requests vs average", f"{s.values['top10_turn_ratio']}x", "8.9x (A, users)"),
    ]


build = analysis_builder("request_mix", fill)


def _types_figure(types: pl.DataFrame) -> Fig:
    fig = new_figure(x_title="request type", y_title="share of requests", barmode="stack")
    fig.update_yaxes(tickformat=".0%")
    x = labels(types["type"].fill_null("(none)").to_list())
    share = types["share"].fill_null(0.0).to_numpy()
    multi = types["multi_turn_share"].fill_null(0.0).to_numpy()
    fig.add_bar(x=x, y=share * (1 - multi), name="first turn")
    fig.add_bar(x=x, y=share * multi, name="follow-up turn (multi-turn)")
    return fig
