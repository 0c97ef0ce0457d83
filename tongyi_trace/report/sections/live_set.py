"""Section: the oracle's live set over time, blocks already computed that a later request reuses, and
its peak in blocks, bytes and x HBM: the cache an oracle needs for the ideal hit ratio (paper Fig 22).
Artifact: analysis/live_set.json."""

from __future__ import annotations

from typing import Any

from tongyi_trace.report import fmt
from tongyi_trace.report.figures import downsample_max, label, new_figure
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.report.sections._analysis import Analysis, analysis_builder

X_HBM_PREFIX = "x_hbm_"


def fill(a: Analysis, s: Section) -> None:
    """Figures, tables and headline of the section from the artifact A."""
    h = a.headline
    models: dict[str, dict[str, Any]] = h.get("models") or {}
    ts = a.table("timeseries").sort("time_s")
    t_min = ts["time_s"].to_numpy() / 60.0
    fig = new_figure(x_title="time (min from trace start)", y_title="live blocks (oracle)")
    x, y = downsample_max(t_min, ts["num_live_blocks"].to_numpy())
    fig.add_scatter(x=x, y=y, mode="lines", name="live blocks", line={"shape": "hv"})
    s.figures["blocks"] = fig
    fig = new_figure(x_title="time (min from trace start)", y_title="live set / HBM for KV (log)")
    fig.update_yaxes(type="log")
    for col in ts.columns:
        if col.startswith(X_HBM_PREFIX):
            x, y = downsample_max(t_min, ts[col].to_numpy())
            fig.add_scatter(x=x, y=y, mode="lines", name=label(col.removeprefix(X_HBM_PREFIX)), line={"shape": "hv"})
    fig.add_hline(y=1.0, line={"dash": "dot", "color": "#999"}, annotation_text="1x HBM")
    s.figures["x_hbm"] = fig
    s.tables["models"] = Table(
        columns=["model", "KV per block", "HBM for KV", "HBM blocks", "peak live set", "peak x HBM"],
        rows=[[name, fmt.size_bytes(m.get("kv_bytes_per_block")), fmt.size_bytes(m.get("hbm_kv_bytes")),
               fmt.count(m.get("hbm_blocks")), fmt.size_bytes(m.get("peak_bytes")), fmt.multiple(m.get("peak_x_hbm"))]
              for name, m in models.items()])
    s.values = {"peak_blocks": fmt.count(h.get("peak_live_blocks")), "peak_time": fmt.seconds(h.get("peak_time_s")),
                "mean_blocks": fmt.count(h.get("mean_live_blocks"))}
    s.headline = [Headline("oracle peak live set (blocks)", s.values["peak_blocks"])]
    s.headline += [Headline(f"oracle peak live set / HBM ({name})", fmt.multiple(m.get("peak_x_hbm")),
                            "~4x (A, Llama3-70B)" if "70b" in name else "") for name, m in models.items()]


build = analysis_builder("live_set", fill)
