"""Section(s): load sweeps (`kvtrace replay --sweep`), one per RUN_DIR/replay/NAME/sweep.json: request
throughput and goodput against the offered load, TTFT and TPOT median and P99 against it, and the table
vllm bench serve prints. Artifact: sweep.json (docs/artifacts/replay.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tongyi_trace.report import fmt
from tongyi_trace.report.artifacts import read_versioned
from tongyi_trace.report.figures import Fig, new_figure
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.run import RunDir
from tongyi_trace.schemas import SWEEP_SCHEMA

REMEDY = "re-run 'kvtrace replay RUN_DIR --server URL --name NAME --sweep rate=... --overwrite'"
UNITS = {"rate": "offered load (requests/s)", "concurrency": "requests in flight"}


def build(run: RunDir) -> list[Section]:
    """One section per sweep folder (a sweep.json), in name order."""
    root = run.path / "replay"
    if not root.is_dir():
        return []
    return [_section(d, i) for i, d in enumerate(sorted(p for p in root.iterdir() if (p / "sweep.json").is_file()))]


def _section(d: Path, index: int) -> Section:
    doc = read_versioned(d / "sweep.json", SWEEP_SCHEMA, REMEDY)
    assert doc is not None  # build() lists folders holding a sweep.json
    kind, name = str(doc.get("kind")), str(doc.get("name") or d.name)
    rows: list[dict[str, Any]] = doc.get("rows") or []
    slo: dict[str, Any] = doc.get("slo") or {}
    s = Section(key=f"sweep-{index}", partial="sweep", title=f"Load sweep on vLLM: {name}",
                definition="One replay per load point: rate R keeps the trace's arrival pattern scaled in time "
                           "to a mean of R requests/s, concurrency N sends every request at once with N in "
                           "flight. Throughput and latencies as vllm bench serve reports them; goodput: the "
                           "requests per second that finished within every SLO (a one-token answer has no TPOT "
                           "and meets that SLO), over the point's span from first send to last completion.")
    s.tables["points"] = Table(
        columns=[UNITS.get(kind, kind), "ok / failed", "requests/s", "output tokens/s", "TTFT median / P99",
                 "TPOT median / P99", "ITL median / P99", "goodput requests/s", "engine hit ratio"],
        rows=[[_load(r.get(kind)), f"{fmt.count(r.get('num_ok'))} / {fmt.count(r.get('num_error'))}",
               fmt.quantity(r.get("requests_per_s")), fmt.quantity(r.get("output_tokens_per_s")),
               _pair(r.get("ttft_ms")), _pair(r.get("tpot_ms")), _pair(r.get("itl_ms")),
               (f"{fmt.quantity(r.get('goodput_per_s'))} ({fmt.count(r.get('num_good'))} of "
                f"{fmt.count(r.get('num_ok'))})") if slo else "no SLO given",
               fmt.ratio(r.get("engine_hit_ratio"))] for r in rows])
    slo_text = ", ".join(f"{k.removesuffix('_ms').upper()} <= {fmt.milliseconds(v)}" for k, v in slo.items())
    s.values = {"name": name, "kind": kind, "status": str(doc.get("status", "")), "server": doc.get("server"),
                "num_points": len(rows), "slo": slo_text or None}
    if rows:
        s.figures["throughput"] = _throughput(rows, kind, bool(slo))
        s.figures["latency"] = _latency(rows, kind)
        best = max(rows, key=lambda r: r.get("goodput_per_s") or 0.0) if slo else None
        if best is not None:
            s.values["best"] = {"load": _load(best.get(kind)),
                                "goodput": fmt.quantity(best.get("goodput_per_s"))}
            s.headline = [Headline(f"best goodput of sweep {name} ({slo_text})",
                                   f"{fmt.quantity(best.get('goodput_per_s'))} requests/s at {kind} "
                                   f"{_load(best.get(kind))}")]
    return s


def _load(value: Any) -> str:
    """A load point as given: 4, 0.5, 16."""
    return f"{value:g}" if isinstance(value, int | float) else fmt.NA


def _pair(d: dict[str, Any] | None) -> str:
    d = d or {}
    return f"{fmt.milliseconds(d.get('median'))} / {fmt.milliseconds(d.get('p99'))}"


def _throughput(rows: list[dict[str, Any]], kind: str, with_goodput: bool) -> Fig:
    x = [r.get(kind) for r in rows]
    fig = new_figure(x_title=UNITS.get(kind, kind), y_title="requests/s")
    fig.add_scatter(x=x, y=[r.get("requests_per_s") for r in rows], mode="lines+markers", name="request throughput")
    if with_goodput:
        fig.add_scatter(x=x, y=[r.get("goodput_per_s") for r in rows], mode="lines+markers",
                        name="goodput (within SLO)")
    if kind == "rate":
        fig.add_scatter(x=x, y=x, mode="lines", name="offered", line={"dash": "dot", "color": "#999"})
    return fig


def _latency(rows: list[dict[str, Any]], kind: str) -> Fig:
    x = [r.get(kind) for r in rows]
    fig = new_figure(x_title=UNITS.get(kind, kind), y_title="ms")
    fig.update_yaxes(type="log")
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
        for stat, dash in (("median", "solid"), ("p99", "dash")):
            fig.add_scatter(x=x, y=[(r.get(key) or {}).get(stat) for r in rows], mode="lines+markers",
                            name=f"{label} {stat}", line={"dash": dash})
    return fig
