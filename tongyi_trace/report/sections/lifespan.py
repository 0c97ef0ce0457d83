"""Section: block lifespan, first access to last reuse, CDF overall and per category with P50/P90/P99
(paper Fig 19-20). Artifact: analysis/lifespan.json."""

from __future__ import annotations

import polars as pl

from tongyi_trace.report import fmt
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.report.sections._analysis import Analysis, analysis_builder
from tongyi_trace.report.sections._curves import categories_to_show, category_cdf
from tongyi_trace.schemas import ALL_CATEGORIES


def fill(a: Analysis, s: Section) -> None:
    """Figures, tables and headline of the section from the artifact A."""
    h = a.headline
    s.figures["reused_cdf"] = category_cdf(a.table("reused_cdf"), "share_of_reused_blocks", x_title="lifespan (s)",
                                           y_title="share of reused blocks", all_label=ALL_CATEGORIES)
    s.figures["cdf"] = category_cdf(a.table("cdf"), "share_of_blocks", x_title="lifespan (s)",
                                    y_title="share of all blocks (never reused = 0 s)", all_label=ALL_CATEGORIES)
    q = a.table("quantiles")
    q = q.filter(pl.col("category").is_in(categories_to_show(q["category"], ALL_CATEGORIES)))
    s.tables["quantiles"] = Table(
        columns=["category", "blocks", "reused", "mean", "P50", "P90", "P99", "P50 reused", "P90 reused",
                 "P99 reused"],
        rows=[[str(r["category"]), fmt.count(r["num_blocks"]), fmt.count(r["num_reused_blocks"]),
               fmt.seconds(r["mean_lifespan_s"]), fmt.seconds(r["p50_s"]), fmt.seconds(r["p90_s"]),
               fmt.seconds(r["p99_s"]), fmt.seconds(r["reused_p50_s"]), fmt.seconds(r["reused_p90_s"]),
               fmt.seconds(r["reused_p99_s"])] for r in q.iter_rows(named=True)])
    s.values = {k: fmt.seconds(h.get(k)) for k in ("p50_s", "p90_s", "p99_s", "reused_p50_s", "reused_p90_s",
                                                   "reused_p99_s", "mean_lifespan_s")}
    s.values["reused_share"] = fmt.pct(_share(h.get("num_reused_blocks"), h.get("num_blocks")))
    s.headline = [
        Headline("block lifespan P90 (all blocks)", s.values["p90_s"], "612 s (A), 0.3 s (B)"),
        Headline("block lifespan P99 (all blocks)", s.values["p99_s"], "97 s (B)"),
    ]


build = analysis_builder("lifespan", fill)


def _share(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else float(part) / float(whole)
