"""Section: reuse time, the time from a block access to the next access of the same prefix-chained
block, per category: the CDF over reuses and the probability of reuse within d, F_w(d)
(paper Fig 12-15). Artifact: analysis/reuse_time.json."""

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
    cdf = a.table("cdf")
    s.figures["share_within"] = category_cdf(cdf, "share_of_reuses_within", x_title="reuse time (s)",
                                             y_title="share of reuses within", all_label=ALL_CATEGORIES)
    s.figures["prob_within"] = category_cdf(cdf, "prob_reused_within", x_title="time since access d (s)",
                                            y_title="P(reused within d) = F_w(d)", all_label=ALL_CATEGORIES)
    cats = a.table("categories")
    cats = cats.filter(pl.col("category").is_in(categories_to_show(cats["category"], ALL_CATEGORIES)))
    s.tables["categories"] = Table(
        columns=["category", "accesses", "reused", "reuse probability", "reuses within 10 s",
                 "reuses within 10 min"],
        rows=[[str(r["category"]), fmt.count(r["num_accesses"]), fmt.count(r["num_reuses"]),
               fmt.ratio(r["reuse_prob"], 3), fmt.pct(r["share_within_10s"]), fmt.pct(r["share_within_600s"])]
              for r in cats.iter_rows(named=True)])
    s.values = {"within_10s": fmt.pct(h.get("share_within_10s")), "within_600s": fmt.pct(h.get("share_within_600s")),
                "reuse_prob": fmt.pct(h.get("reuse_prob")), "num_reuses": fmt.count(h.get("num_reuses"))}
    s.headline = [
        Headline("reuses within 10 s", s.values["within_10s"], "80% (B)"),
        Headline("reuses within 10 min", s.values["within_600s"], "80% (A)"),
    ]


build = analysis_builder("reuse_time", fill)
