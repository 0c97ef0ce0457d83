"""Section: producer x consumer heatmap of ideal hits over the top users (or sessions), with the
diagonal share (paper Fig 6). Artifact: analysis/user_heatmap.json."""

from __future__ import annotations

import numpy as np

from tongyi_trace.report import fmt
from tongyi_trace.report.figures import labels, new_figure
from tongyi_trace.report.model import Headline, Section
from tongyi_trace.report.sections._analysis import Analysis, analysis_builder


def fill(a: Analysis, s: Section) -> None:
    """Figures, tables and headline of the section from the artifact A."""
    h = a.headline
    key_label = str(h.get("key_label") or "users")
    m = a.table("matrix")
    n = int(max(m["producer_rank"].to_numpy().max(), m["consumer_rank"].to_numpy().max())) + 1 if m.height else 0
    if n:
        names = ["?"] * n
        for rank, key in zip(m["producer_rank"], m["producer"], strict=True):
            names[rank] = str(key)
        for rank, key in zip(m["consumer_rank"], m["consumer"], strict=True):
            names[rank] = str(key)
        z = np.full((n, n), np.nan)
        z[m["consumer_rank"].to_numpy(), m["producer_rank"].to_numpy()] = m["share"].to_numpy()
        ticks = labels(names)
        fig = new_figure(x_title=f"producer ({key_label}: who first computed the block)",
                         y_title=f"consumer ({key_label}: whose request hit)", height_px=360)
        fig.add_heatmap(z=z, x=ticks, y=ticks, colorscale="Viridis", hoverongaps=False,
                        colorbar={"title": {"text": "share of hits"}, "tickformat": ".0%"})
        fig.update_xaxes(type="category")
        fig.update_yaxes(type="category", autorange="reversed")
        s.figures["matrix"] = fig
    s.values = {"key_label": key_label, "diagonal_share": fmt.pct(h.get("diagonal_share")),
                "top_diagonal_share": fmt.pct(h.get("top_diagonal_share")), "top_n": fmt.count(h.get("top_n")),
                "num_keys_with_hits": fmt.count(h.get("num_keys_with_hits")), "num_hits": fmt.count(h.get("num_hits")),
                "sessions": h.get("key_kind") == "session"}
    s.headline = [Headline(f"diagonal share of hits ({key_label} reuse their own blocks)",
                           fmt.pct(h.get("diagonal_share")), "almost all on the diagonal")]


build = analysis_builder("user_heatmap", fill)
