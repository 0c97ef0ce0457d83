"""Section: per-request KV-cache size relative to the HBM left for KV, per model preset (paper Fig 21).
Artifact: analysis/kv_size.json."""

from __future__ import annotations

from typing import Any

import polars as pl

from tongyi_trace.report import fmt
from tongyi_trace.report.figures import label, new_figure
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.report.sections._analysis import Analysis, analysis_builder


def fill(a: Analysis, s: Section) -> None:
    """Figures, tables and headline of the section from the artifact A."""
    models: dict[str, dict[str, Any]] = a.headline.get("models") or {}
    pc = a.table("percentiles")
    fig = new_figure(x_title="KV of one request (prompt + output) as a share of HBM for KV",
                     y_title="share of requests")
    fig.update_xaxes(type="log")
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    order = {name: i for i, name in enumerate(models)}
    pc = pc.sort(by=[pl.col("model").replace_strict(order, default=len(order)), pl.col("percentile")])
    for (name,), part in pc.group_by(["model"], maintain_order=True):
        fig.add_scatter(x=part["total_x_hbm"].to_numpy(), y=part["percentile"].to_numpy() / 100.0,
                        mode="lines", line={"shape": "hv"}, name=label(name))
    s.figures["cdf"] = fig
    s.tables["models"] = Table(
        columns=["model", "TP", "KV per 16 tokens", "HBM for KV", "HBM blocks", "P50 request", "P99 request",
                 "P99 x HBM", "largest x HBM"],
        rows=[[str(m.get("name", key)), fmt.count(m.get("tp")), f"{fmt.num(m.get('mib_per_16_tokens'), 4)} MiB",
               fmt.size_bytes(m.get("hbm_kv_bytes")), fmt.count(m.get("hbm_blocks")),
               fmt.size_bytes(m.get("total_kv_p50_bytes")), fmt.size_bytes(m.get("total_kv_p99_bytes")),
               fmt.multiple(m.get("total_p99_x_hbm")), fmt.multiple(m.get("total_max_x_hbm"))]
              for key, m in models.items()])
    first = next(iter(models.values()), {})
    s.values = {"model": str(first.get("name", "")), "p99_x_hbm": fmt.multiple(first.get("total_p99_x_hbm")),
                "p99_bytes": fmt.size_bytes(first.get("total_kv_p99_bytes")),
                "mib_per_16": fmt.num(first.get("mib_per_16_tokens"), 4)}
    s.headline = [
        Headline(f"KV per 16 tokens ({s.values['model']})", f"{s.values['mib_per_16']} MiB",
                 "0.875 MiB (Qwen2-7B)" if s.values["model"] == "qwen2-7b" else ""),
        Headline(f"P99 request KV / HBM for KV ({s.values['model']})", s.values["p99_x_hbm"]),
    ]


build = analysis_builder("kv_size", fill)
