"""Plotly figures for the report as plain figure specs (the JSON plotly.js draws), built fast.

`Fig` mirrors the few plotly.graph_objects calls the sections need (add_scatter, add_bar,
add_heatmap, update_xaxes...) but only fills dicts: building and serializing graph_objects costs
seconds per report, this costs milliseconds. The test suite checks every spec against Plotly's schema.

Numeric numpy arrays are written as plotly.js typed arrays ({"dtype", "bdata": base64}), NaN as a gap.
Every string that comes from a trace (type, category, user id...) and ends up inside a figure goes
through `label()`: Plotly renders a subset of HTML in its text, so such a string is entity-escaped and
shows as literal text. Figure JSON is embedded in a <script type="application/json"> element; `<`, `>`,
`&`, U+2028 and U+2029 are written as \\u escapes so no string can close that element.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import plotly.io as pio
from plotly.io.json import to_json_plotly

MAX_CURVE_POINTS = 600
MAX_LABEL_CHARS = 40
TEMPLATE_NAME = "plotly_white"

_SCRIPT_SAFE = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
                0x2028: "\\u2028", 0x2029: "\\u2029"}


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
    """OBJ as compact JSON (numpy arrays as typed arrays, NaN as null), safe inside a <script> element."""
    return script_safe_json(json.dumps(_jsonable(obj), separators=(",", ":"), allow_nan=False))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _array(obj)
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _array(a: np.ndarray) -> Any:
    """A numpy array as plotly.js takes it: a typed array (base64, with its shape when 2-D) for numbers,
    else a list."""
    if a.dtype.kind == "b":
        a = a.astype(np.uint8)
    if a.dtype.kind in "iu":
        lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
        a = a.astype(np.int32) if lo >= -(2**31) and hi < 2**31 else a.astype(np.float64)
    elif a.dtype.kind == "f":
        a = a.astype(np.float64)
    else:
        return _jsonable(a.tolist())
    spec = {"dtype": "i4" if a.dtype == np.int32 else "f8",
            "bdata": base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")}
    if a.ndim > 1:
        spec["shape"] = ", ".join(str(n) for n in a.shape)
    return spec


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


@dataclass
class Fig:
    """A Plotly figure spec: `data` (traces) and `layout`, as plotly.js takes them."""

    data: list[dict[str, Any]] = field(default_factory=list)
    layout: dict[str, Any] = field(default_factory=dict)

    def add_trace(self, trace_type: str, **attrs: Any) -> Fig:
        """Append a trace of TRACE_TYPE with ATTRS (plotly.js attribute names, nested dicts)."""
        self.data.append({"type": trace_type, **attrs})
        return self

    def add_scatter(self, **attrs: Any) -> Fig:
        """Append a scatter (line / markers) trace."""
        return self.add_trace("scatter", **attrs)

    def add_bar(self, **attrs: Any) -> Fig:
        """Append a bar trace."""
        return self.add_trace("bar", **attrs)

    def add_heatmap(self, **attrs: Any) -> Fig:
        """Append a heatmap trace."""
        return self.add_trace("heatmap", **attrs)

    def update_layout(self, **attrs: Any) -> Fig:
        """Merge ATTRS into the layout (nested dicts merged key by key)."""
        _merge(self.layout, attrs)
        return self

    def update_xaxes(self, **attrs: Any) -> Fig:
        """Merge ATTRS into the x axis."""
        return self.update_layout(xaxis=attrs)

    def update_yaxes(self, **attrs: Any) -> Fig:
        """Merge ATTRS into the y axis."""
        return self.update_layout(yaxis=attrs)

    def add_hline(self, y: float, line: dict[str, Any], annotation_text: str = "") -> Fig:
        """A horizontal line across the plot at Y, with an optional note at its right end."""
        self.layout.setdefault("shapes", []).append(
            {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": y, "y1": y, "line": line})
        if annotation_text:
            self.layout.setdefault("annotations", []).append(
                {"xref": "paper", "x": 1, "xanchor": "right", "yref": "y", "y": y, "yanchor": "bottom",
                 "text": annotation_text, "showarrow": False})
        return self


def figure_json(fig: Fig) -> str:
    """FIG as compact, script-safe JSON (the page applies the shared template)."""
    return dumps_script_safe({"data": fig.data, "layout": fig.layout})


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


def new_figure(*, x_title: str = "", y_title: str = "", height_px: int = 270, **layout: Any) -> Fig:
    """An empty figure with the report's common layout (axis titles, height, margins, legend)."""
    fig = Fig()
    fig.update_layout(height=height_px, margin={"l": 60, "r": 20, "t": 30, "b": 50},
                      legend={"orientation": "h", "y": -0.3, "yanchor": "top", "traceorder": "normal"},
                      xaxis={"title": {"text": x_title}}, yaxis={"title": {"text": y_title}})
    return fig.update_layout(**layout)


def fit_range(values: Sequence[float | None], lo_bound: float = -math.inf, hi_bound: float = math.inf,
              pad: float = 0.3) -> list[float] | None:
    """An axis range around VALUES (finite ones) padded by PAD x their spread on each side, within
    [LO_BOUND, HI_BOUND], so that their differences fill most of the axis (bars of 8.8-10.3% on a 0-100% axis
    hide a 1.5-point difference); None when there are no finite values."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return None
    lo, hi = min(v), max(v)
    spread = hi - lo if hi > lo else max(abs(hi), 1e-9) * 0.1
    return [max(lo_bound, lo - pad * spread), min(hi_bound, hi + pad * spread)]


PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#bcbd22", "#7f7f7f"]
DASHES = ["solid", "dash", "dot", "dashdot", "longdash"]
ALL_LINE = {"color": "#222222", "width": 3}


def category_lines(categories: Sequence[str], all_label: str) -> dict[str, dict[str, Any]]:
    """Line style per category `<type>-<turn bucket>`: colour by type, dash by turn bucket; ALL_LABEL
    (the curve over all categories) thick and dark. Categories are ordered as given."""
    split = {c: [*c.rsplit("-", 1), ""][:2] for c in categories if c != all_label}
    types = sorted({t for t, _ in split.values()})
    buckets = sorted({b for _, b in split.values()}, key=lambda b: (len(b), b))
    styles: dict[str, dict[str, Any]] = {}
    for c in categories:
        if c == all_label:
            styles[c] = dict(ALL_LINE)
        else:
            t, b = split[c]
            styles[c] = {"color": PALETTE[types.index(t) % len(PALETTE)],
                         "dash": DASHES[buckets.index(b) % len(DASHES)], "width": 1.5}
    return styles


def add_curves(fig: Fig, groups: dict[str, tuple[np.ndarray, np.ndarray]], *, mode: str = "lines",
               shape: str = "linear", max_points: int = MAX_CURVE_POINTS,
               lines: dict[str, dict[str, Any]] | None = None) -> Fig:
    """Add one line per group (name -> (x, y)), downsampled, names from the trace escaped; LINES gives
    a line style per group name."""
    for name, (x, y) in groups.items():
        xs, ys = downsample(x, y, max_points)
        fig.add_scatter(x=xs, y=ys, name=label(name), mode=mode, line={"shape": shape, **(lines or {}).get(name, {})})
    return fig
