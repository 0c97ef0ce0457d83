"""Cumulative curves over the analyses' log-spaced time bins (reuse time, lifespan), one per category.

A bin row (upper_s, cumulative share) is drawn as a point at the bin's upper edge, joined linearly
(log-uniform inside a bin); each curve starts at 0 one bin below its first point. Zero durations
(upper_s = 0) are drawn at 1 ms on the log axis.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tongyi_trace.analysis.common import BINS_PER_DECADE
from tongyi_trace.report.figures import Fig, add_curves, category_lines, new_figure

ZERO_DRAWN_AT_S = 1e-3


def category_cdf(df: pl.DataFrame, y_col: str, *, x_title: str, y_title: str, all_label: str) -> Fig:
    """One curve per category of DF (columns category, upper_s, Y_COL), the ALL_LABEL row first.

    When the trace has a single category, its curve equals the overall one and only that is drawn.
    """
    fig = new_figure(x_title=x_title, y_title=y_title)
    fig.update_xaxes(type="log")
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    groups: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for cat in categories_to_show(df["category"], all_label):
        part = df.filter(pl.col("category") == cat).sort("upper_s")
        x = np.maximum(part["upper_s"].to_numpy(), ZERO_DRAWN_AT_S)
        y = part[y_col].fill_null(0.0).to_numpy()
        groups[str(cat)] = (np.concatenate(([x[0] / 10 ** (1 / BINS_PER_DECADE)], x)), np.concatenate(([0.0], y)))
    return add_curves(fig, groups, mode="lines", lines=category_lines(list(groups), all_label))


def categories_to_show(categories: pl.Series, all_label: str) -> list[str]:
    """ALL_LABEL first, then the categories sorted; without them when there is only one (it equals all)."""
    cats = sorted({str(c) for c in categories.drop_nulls().to_list()} - {all_label})
    head = [all_label] if all_label in set(categories.to_list()) else []
    return head + (cats if len(cats) > 1 or not head else [])
