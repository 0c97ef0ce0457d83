"""Section: spatial locality, the ideal hit ratio when each request caches only the blocks in the
relative window [offset, offset + stride) of its length, as a stride x offset heatmap, overall and per
type (paper Fig 16-18). Artifact: analysis/spatial.json."""

from __future__ import annotations

import numpy as np
import polars as pl

from tongyi_trace.report import fmt
from tongyi_trace.report.figures import Fig, new_figure
from tongyi_trace.report.model import Headline, Section
from tongyi_trace.report.sections._analysis import Analysis, analysis_builder

MAX_TYPES = 5  # per-type heatmaps shown (largest types first), beside the one over all requests


def fill(a: Analysis, s: Section) -> None:
    """Figures, tables and headline of the section from the artifact A."""
    h = a.headline
    hm = a.table("heatmap")
    s.figures["all"] = _heatmap(hm.filter(pl.col("type").is_null()), height_px=240)
    typed = hm.filter(pl.col("type").is_not_null())
    if typed.height:
        sizes = typed.group_by("type").agg(pl.col("num_blocks").max()).sort(["num_blocks", "type"],
                                                                              descending=[True, False])
        types = sizes["type"].to_list()[:MAX_TYPES]
        s.values["types"] = [(f"type{i}", str(t)) for i, t in enumerate(types)]
        for i, t in enumerate(types):
            s.figures[f"type{i}"] = _heatmap(typed.filter(pl.col("type") == t), height_px=240)
    else:
        s.values["types"] = []
    best = h.get("best_partial_window") or {}
    s.values.update({
        "full": fmt.pct(h.get("full_window_hit_ratio")), "head50": fmt.pct(h.get("head_50pct_hit_ratio")),
        "tail50": fmt.pct(h.get("tail_50pct_hit_ratio")),
        "best": (f"offset {best.get('offset_pct')}%, stride {best.get('stride_pct')}%: "
                 f"{fmt.pct(best.get('hit_ratio'))}") if best else "n/a",
        "num_hidden_types": max(0, typed["type"].n_unique() - MAX_TYPES) if typed.height else 0,
    })
    s.headline = [Headline("ideal hit ratio caching only the first / last 50% of each request",
                           f"{s.values['head50']} / {s.values['tail50']}",
                           "head caching wins; B peaks ~50% at stride 50%")]


build = analysis_builder("spatial", fill)


# Viridis with the cells that hit nothing in light grey: most windows that skip the head hit nothing, and one
# dark colour for "nothing" and "little" hid where the hits are.
ZERO_GREY_VIRIDIS = [[0.0, "#eeeeee"], [1e-6, "#440154"], [0.25, "#3b528b"], [0.5, "#21918c"], [0.75, "#5ec962"],
                     [1.0, "#fde725"]]


def _heatmap(df: pl.DataFrame, height_px: int = 320) -> Fig:
    offsets = sorted(df["offset_pct"].unique().to_list())
    strides = sorted(df["stride_pct"].unique().to_list())
    z = np.full((len(offsets), len(strides)), np.nan)
    oi = {o: i for i, o in enumerate(offsets)}
    si = {st: j for j, st in enumerate(strides)}
    for o, st, v in zip(df["offset_pct"], df["stride_pct"], df["hit_ratio"], strict=True):
        z[oi[o], si[st]] = np.nan if v is None else v
    fig = new_figure(x_title="stride (% of request)", y_title="offset (% of request)", height_px=height_px)
    top = float(np.nanmax(z)) if np.isfinite(z).any() else 0.0
    fig.add_heatmap(z=z, x=strides, y=offsets, colorscale=ZERO_GREY_VIRIDIS, zmin=0, zmax=top if top > 0 else 1.0,
                    hoverongaps=False,
                    colorbar={"title": {"text": "hit ratio"}, "tickformat": ".0%"})
    fig.update_xaxes(ticksuffix="%", dtick=10)
    fig.update_yaxes(ticksuffix="%", dtick=10)
    return fig
