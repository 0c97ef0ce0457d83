"""Plotly helpers for the report: trace-safe labels, curve downsampling, compact embeddable JSON.

Every string that comes from a trace (type, category, user id...) and ends up inside a figure goes
through `label()`: Plotly renders a subset of HTML in its text, so such a string is entity-escaped and
shows as literal text. Figure JSON is embedded in a <script type="application/json"> element; `<`, `>`,
`&`, U+2028 and U+2029 are written as \\u escapes so no string can close that element.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.io.json import to_json_plotly

MAX_CURVE_POINTS = 600
TEMPLATE_NAME = "plotly_white"

_SCRIPT_SAFE = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
                0x2028: "\\u2028", 0x2029: "\\u2029"}


MAX_LABEL_CHARS = 40


def label(text: object, max_chars: int = MAX_LABEL_CHARS) -> str:
    """TEXT (from a trace) escaped so that Plotly shows it literally instead of interpreting tags;
    longer than MAX_CHARS it is cut and ends with an ellipsis."""
    s = str(text)
    if len(s) > max_chars:
        s = s[: max_chars - 1] + "\u2026"
    return html.escape(s, quote=True)


def labels(texts: Sequence[object], max_chars: int = MAX_LABEL_CHARS) -> list[str]:
    """`label()` of each of TEXTS, kept distinct: a cut label that collides gets its index appended."""
    out: list[str] = []
    seen: set[str] = set()
    for i, t in enumerate(texts):
        lab = label(t, max_chars)
        if lab in seen:
            lab = f"{lab} #{i}"
        seen.add(lab)
        out.append(lab)
    return out


def script_safe_json(text: str) -> str:
    """JSON TEXT made safe to place inside a <script> element (no '<', '>', '&', line separators)."""
    return text.translate(_SCRIPT_SAFE)


def dumps_script_safe(obj: Any) -> str:
    """OBJ as compact JSON, safe inside a <script> element."""
    return script_safe_json(json.dumps(obj, separators=(",", ":"), allow_nan=False))


def figure_json(fig: go.Figure) -> str:
    """FIG as compact JSON without its template (the page applies one shared template), script-safe.

    Numeric arrays are base64 typed arrays (plotly.py's encoding, decoded by plotly.js).
    """
    fig = go.Figure(fig)
    fig.layout.template = None
    return script_safe_json(pio.to_json(fig, validate=False, pretty=False))


def template_json() -> str:
    """The shared Plotly layout template of the report, as script-safe JSON."""
    return script_safe_json(to_json_plotly(pio.templates[TEMPLATE_NAME].to_plotly_json()))


def downsample(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray,
               max_points: int = MAX_CURVE_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most MAX_POINTS of the curve (X, Y): evenly spaced by index, first and last point kept.

    For a CDF (X sorted, Y the cumulative share) even index spacing is even spacing in probability,
    so the shape is kept wherever the curve moves.
    """
    xa, ya = np.asarray(x), np.asarray(y)
    if len(xa) != len(ya):
        raise ValueError(f"curve has {len(xa)} x values and {len(ya)} y values")
    if len(xa) <= max_points:
        return xa, ya
    idx = np.unique(np.linspace(0, len(xa) - 1, max_points).round().astype(np.int64))
    return xa[idx], ya[idx]


def new_figure(*, x_title: str = "", y_title: str = "", height_px: int = 360, **layout: Any) -> go.Figure:
    """An empty figure with the report's common layout (axis titles, height, margins, legend)."""
    fig = go.Figure()
    defaults: dict[str, Any] = {"margin": {"l": 60, "r": 20, "t": 30, "b": 50},
                                "legend": {"orientation": "h", "y": -0.2, "traceorder": "normal"}}
    fig.update_layout(height=height_px, **(defaults | layout))
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title)
    return fig


def downsample_max(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray,
                   max_points: int = MAX_CURVE_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most MAX_POINTS of the time series (X, Y): per run of consecutive points, the one with the
    largest Y (so peaks survive), first and last point kept."""
    xa, ya = np.asarray(x), np.asarray(y)
    if len(xa) != len(ya):
        raise ValueError(f"series has {len(xa)} x values and {len(ya)} y values")
    if len(xa) <= max_points:
        return xa, ya
    starts = np.linspace(0, len(xa), max_points - 1, endpoint=False).astype(np.int64)
    ends = np.append(starts[1:], len(xa))
    idx = np.array([s + int(np.argmax(ya[s:e])) for s, e in zip(starts, ends, strict=True)])
    idx = np.unique(np.concatenate(([0], idx, [len(xa) - 1])))
    return xa[idx], ya[idx]


def add_curves(fig: go.Figure, groups: dict[str, tuple[np.ndarray, np.ndarray]], *, mode: str = "lines",
               shape: str = "linear", max_points: int = MAX_CURVE_POINTS) -> go.Figure:
    """Add one line per group (name -> (x, y)), downsampled, names from the trace escaped."""
    for name, (x, y) in groups.items():
        xs, ys = downsample(x, y, max_points)
        fig.add_scatter(x=xs, y=ys, name=label(name), mode=mode, line={"shape": shape})
    return fig
