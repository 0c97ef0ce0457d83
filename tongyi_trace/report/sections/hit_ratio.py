"""Section: ideal prefix hit ratio overall, per category and per type, with the token-level and the
position-free content variants for contrast (paper Fig 4). Artifact: analysis/hit_ratio.json."""

from __future__ import annotations

import polars as pl

from tongyi_trace.report import fmt
from tongyi_trace.report.figures import Fig, labels, new_figure
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.report.sections._analysis import Analysis, analysis_builder

VARIANTS = [("hit_ratio", "prefix, blocks"), ("token_hit_ratio", "prefix, tokens"),
            ("content_hit_ratio", "content ids at any position")]


def fill(a: Analysis, s: Section) -> None:
    """Figures, tables and headline of the section from the artifact A."""
    h = a.headline
    cat = a.table("by_category").sort("category")
    s.figures["by_category"] = _bars(cat, "category")
    s.tables["by_category"] = _table(cat, "category")
    if a.has_table("by_type"):
        typ = a.table("by_type")
        s.figures["by_type"] = _bars(typ, "type")
        s.tables["by_type"] = _table(typ, "type")
    s.values = {"hit_ratio": fmt.pct(h.get("hit_ratio")), "token_hit_ratio": fmt.pct(h.get("token_hit_ratio")),
                "content_hit_ratio": fmt.pct(h.get("content_hit_ratio")),
                "num_hit_blocks": fmt.count(h.get("num_hit_blocks")),
                "num_block_refs": fmt.count(h.get("num_block_refs"))}
    s.headline = [
        Headline("ideal prefix hit ratio (blocks)", fmt.ratio(h.get("hit_ratio")), "0.62 (A), 0.54 (B)"),
        Headline("ideal prefix hit ratio (tokens)", fmt.ratio(h.get("token_hit_ratio"))),
        Headline("content-id hit ratio (no prefix rule)", fmt.ratio(h.get("content_hit_ratio")),
                 "80%+ often claimed on synthetic data"),
    ]


build = analysis_builder("hit_ratio", fill)


def _bars(df: pl.DataFrame, key: str) -> Fig:
    fig = new_figure(x_title=key, y_title="ideal hit ratio", barmode="group")
    fig.update_yaxes(range=[0, 1], tickformat=".0%")
    x = labels(df[key].fill_null("(none)").to_list())
    for col, name in VARIANTS:
        fig.add_bar(x=x, y=df[col].to_numpy(), name=name)
    return fig


def _table(df: pl.DataFrame, key: str) -> Table:
    return Table(
        columns=[key, "requests", "block refs", "hit ratio", "token hit ratio", "content hit ratio"],
        rows=[[str(r[key]), fmt.count(r["num_requests"]), fmt.count(r["num_blocks"]), fmt.ratio(r["hit_ratio"]),
               fmt.ratio(r["token_hit_ratio"]), fmt.ratio(r["content_hit_ratio"])]
              for r in df.iter_rows(named=True)],
    )
