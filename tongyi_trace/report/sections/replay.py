"""Section(s): live replays against a vLLM server, one section per RUN_DIR/replay/NAME/: the run's
figures, the reconciliation of ideal, simulated (the policy the engine ran) and engine-reported hits per request, TTFT
distributions, TTFT vs uncached tokens with the fitted cost model, and the WA plugin's counters when
it ran. Artifacts: summary.json, records.jsonl, reconcile.parquet, plugin_stats.json
(docs/artifacts/replay.md, docs/artifacts/compare.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tongyi_trace.replay.records import read_records
from tongyi_trace.report import fmt
from tongyi_trace.report.artifacts import read_parquet, read_versioned
from tongyi_trace.report.figures import Fig, add_curves, category_lines, label, new_figure
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.run import RunDir
from tongyi_trace.schemas import REPLAY_SCHEMA
from tongyi_trace.vllm_plugin.stats import read_stats

REMEDY = "re-run 'kvtrace replay RUN_DIR --server URL --name NAME --overwrite'"
MAX_SCATTER_POINTS = 3000
NUM_WORST = 10


def build(run: RunDir) -> list[Section]:
    """One section per replay folder that has a summary.json, in name order."""
    root = run.path / "replay"
    if not root.is_dir():
        return []
    sections: list[Section] = []
    for d in sorted(p for p in root.iterdir() if (p / "summary.json").is_file()):
        sections.append(_replay_section(d, len(sections)))
    return sections


def _replay_section(d: Path, index: int) -> Section:
    doc = read_versioned(d / "summary.json", REPLAY_SCHEMA, REMEDY)
    assert doc is not None  # build() lists folders holding a summary.json
    name = str(doc.get("name") or d.name)
    s = Section(key=f"replay-{index}", partial="replay", title=f"Live replay on vLLM: {name}",
                paper_ref="section 5 (replay)",
                definition="Each trace block id becomes a fixed list of token ids (same id, same tokens); requests "
                           "are sent at the trace's timestamps (divided by the speedup) with their output "
                           "length forced; the engine's cached_tokens per request is compared with the "
                           "simulator's prediction of the policy the engine ran (LRU for stock vLLM, the "
                           "plugin's policy with its file and guard) at the engine's block size and block count.")
    records = read_records(d / "records.jsonl")
    ok = records.filter(pl.col("status") == "ok")
    if doc.get("status") in (None, "running"):  # the report holds the run lock: no replay of this run runs now
        doc = {**doc, "status": "never finished (killed)",
               "error": f"its summary still says 'running'; {records.height} requests recorded; rebuild the summary "
                        f"with 'kvtrace replay {d.parent.parent} --name {d.name} --reconcile-only'"}
    counts = doc.get("counts") or {"num_done": records.height, "num_ok": ok.height,
                                   "num_error": records.height - ok.height}
    engine = doc.get("engine") or {}
    opts = doc.get("options") or {}
    rec = doc.get("reconciliation")
    s.tables["run"] = Table(columns=["quantity", "value"], rows=[
        ["server / model", f"{doc.get('server', '')} / {doc.get('model', '')}"],
        ["status", str(doc.get("status", ""))],
        ["requests finished (ok / error / not finished)",
         f"{fmt.count(counts.get('num_done'))} ({fmt.count(counts.get('num_ok'))} / "
         f"{fmt.count(counts.get('num_error'))} / {fmt.count(counts.get('num_not_finished'))})"],
        ["engine block size / KV blocks", f"{fmt.count(engine.get('block_size'))} tokens / "
                                          f"{fmt.count(engine.get('num_gpu_blocks'))}"],
        ["speedup", fmt.num(opts.get("speedup"))],
        ["wall time", fmt.seconds(doc.get("wall_s"))],
        ["engine hit ratio (/metrics deltas)", fmt.ratio((doc.get("metrics") or {}).get("hit_ratio"))],
        ["engine hit ratio (cached / prompt tokens of ok requests)", fmt.ratio(doc.get("records_hit_ratio"))],
        ["dispatch drift P50 / P99 (the client's lateness)", _ms_pair(doc.get("drift_ms"))],
        ["held back by --max-in-flight / --closed-sessions P50 / P99", _ms_pair(doc.get("held_ms"))],
        ["TTFT P50 / P99", _ms_pair(doc.get("ttft_ms"))],
        ["TPOT P50 / P99 (per output token after the first)", _ms_pair(doc.get("tpot_ms"))],
        ["ITL P50 / P99 (between streamed chunks)", _ms_pair(doc.get("itl_ms"))],
        ["end-to-end P50 / P99", _ms_pair(doc.get("e2e_ms"))],
        ["throughput: requests / output tokens / total tokens per s", _throughput(doc.get("throughput"))],
        ["skipped as too long for the engine", _too_long(doc)],
    ])
    errors = doc.get("errors") or []
    if errors:
        s.tables["errors"] = Table(columns=["error", "requests"],
                                   rows=[[str(e.get("error")), fmt.count(e.get("count"))] for e in errors])
    s.values = {"name": name, "status": str(doc.get("status", "")), "error": doc.get("error"),
                "num_ok": fmt.count(counts.get("num_ok")), "note": doc.get("reconciliation_note"),
                "has_reconciliation": rec is not None, "has_cost": False, "plugin": None}
    if rec is not None:
        _reconciliation(s, d, rec)
    if ok.height:
        s.figures["ttft"] = _ttft_cdf(ok)
        cost = doc.get("cost_model")
        s.figures["ttft_vs_uncached"] = _ttft_vs_uncached(ok, cost)
        s.values["has_cost"] = cost is not None
        if cost is not None:
            s.values["cost"] = {"a_ms": fmt.milliseconds(1000 * float(cost.get("a_s") or 0)),
                                "b_us": fmt.num(1e6 * float(cost.get("b_s_per_token") or 0)),
                                "r2": fmt.ratio(cost.get("r2"), 3), "n": fmt.count(cost.get("num_points"))}
    s.headline = [Headline(f"engine hit ratio, replay {name}", fmt.ratio(doc.get("records_hit_ratio")))]
    if rec is not None:
        s.headline += [
            Headline(f"simulator {_predicted(rec)} prediction, replay {name}",
                     fmt.ratio(rec.get("predicted_hit_ratio"))),
            Headline(f"requests where engine = simulator, replay {name}", fmt.pct(rec.get("exact_share"))),
        ]
    s.headline.append(Headline(f"TTFT P50 / P99, replay {name}", _ms_pair(doc.get("ttft_ms"))))
    plugin = doc.get("plugin") or read_stats(d)
    if plugin:
        _plugin(s, plugin)
    return s


def _predicted(rec: dict[str, Any]) -> str:
    """The policy the reconciliation simulated: what the engine ran (LRU in summaries older than the field)."""
    return str(rec.get("predicted_policy") or "lru").upper()


def _throughput(t: dict[str, Any] | None) -> str:
    t = t or {}
    return " / ".join(fmt.quantity(t.get(k)) for k in ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s"))


def _too_long(doc: dict[str, Any]) -> str:
    """How many requests of the window were skipped as too long, and why (the engine's max_model_len)."""
    sel = doc.get("selection") or {}
    n = sel.get("num_too_long")
    if not n:
        return fmt.count(n)
    mml = (doc.get("engine") or {}).get("max_model_len")
    return (f"{fmt.count(n)} of {fmt.count(sel.get('num_in_window'))}: prompt + forced output tokens exceed the "
            f"engine's max_model_len ({fmt.count(mml)}); start the engine with a larger --max-model-len to "
            "include them")


def _ms_pair(d: dict[str, Any] | None) -> str:
    d = d or {}
    return f"{fmt.milliseconds(d.get('p50'))} / {fmt.milliseconds(d.get('p99'))}"


def _reconciliation(s: Section, d: Path, rec: dict[str, Any]) -> None:
    s.tables["reconcile"] = Table(columns=["", "hit tokens", "hit ratio (of prompt tokens)"], rows=[
        ["ideal (unlimited cache)", fmt.count(rec.get("ideal_hit_tokens")), fmt.ratio(rec.get("ideal_hit_ratio"))],
        [f"simulator ({_predicted(rec)}, engine's blocks)", fmt.count(rec.get("predicted_hit_tokens")),
         fmt.ratio(rec.get("predicted_hit_ratio"))],
        ["engine (cached_tokens)", fmt.count(rec.get("engine_cached_tokens")), fmt.ratio(rec.get("engine_hit_ratio"))],
    ])
    s.values.update({"exact_share": fmt.pct(rec.get("exact_share")), "predicted_policy": _predicted(rec),
                     "gap_pp": fmt.num(rec.get("engine_minus_predicted_pp")),
                     "num_above": fmt.count(rec.get("num_engine_above")),
                     "num_below": fmt.count(rec.get("num_engine_below")),
                     "mean_abs_gap": fmt.num(rec.get("mean_abs_gap_tokens")),
                     "num_requests": fmt.count(rec.get("num_requests"))})
    s.tables["by_category"] = Table(
        columns=["category", "requests", "prompt tokens", "ideal", "simulator", "engine", "engine = simulator"],
        rows=[[str(c.get("category")), fmt.count(c.get("num_requests")), fmt.count(c.get("prompt_tokens")),
               fmt.count(c.get("ideal_hit_tokens")), fmt.count(c.get("predicted_hit_tokens")),
               fmt.count(c.get("engine_cached_tokens")), fmt.pct(c.get("exact_share"))]
              for c in rec.get("by_category") or []])
    worst = [w for w in (rec.get("worst") or []) if w.get("engine_minus_predicted")][:NUM_WORST]
    if worst:
        s.tables["worst"] = Table(
            columns=["send order", "request", "category", "prompt tokens", "ideal", "simulator", "engine",
                     "engine - simulator"],
            rows=[[fmt.count(w.get("order")), fmt.count(w.get("req_idx")), str(w.get("category")),
                   fmt.count(w.get("prompt_tokens")), fmt.count(w.get("ideal_hit_tokens")),
                   fmt.count(w.get("predicted_hit_tokens")), fmt.count(w.get("engine_cached_tokens")),
                   fmt.count(w.get("engine_minus_predicted"))] for w in worst])
    table = read_parquet(d / "reconcile.parquet", REMEDY)
    if table is not None and table.height:
        s.figures["reconcile"] = _reconcile_scatter(table, _predicted(rec))


def _thin(df: pl.DataFrame, max_rows: int = MAX_SCATTER_POINTS) -> pl.DataFrame:
    """Every k-th row so that at most MAX_ROWS remain (deterministic)."""
    return df if df.height <= max_rows else df.gather_every(-(-df.height // max_rows))


def _reconcile_scatter(t: pl.DataFrame, policy: str) -> Fig:
    t = _thin(t.sort("order"))
    top = float(max(t["predicted_hit_tokens"].max() or 0, t["engine_cached_tokens"].max() or 0, 1))  # type: ignore[arg-type]
    fig = new_figure(x_title=f"simulator predicted hit tokens ({policy})", y_title="engine cached_tokens")
    fig.add_scatter(x=[0, top], y=[0, top], mode="lines", name="engine = simulator",
                    line={"dash": "dot", "color": "#999"})
    fig.add_scatter(x=t["predicted_hit_tokens"].to_numpy(), y=t["engine_cached_tokens"].to_numpy(), mode="markers",
                    name="request", marker={"size": 5, "opacity": 0.6},
                    text=[label(c) for c in t["category"].to_list()],
                    hovertemplate="%{text}<br>simulator %{x}<br>engine %{y}<extra></extra>")
    return fig


def _ttft_cdf(ok: pl.DataFrame) -> Fig:
    fig = new_figure(x_title="TTFT (ms)", y_title="share of requests")
    fig.update_xaxes(type="log")
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    ttft = ok.filter(pl.col("ttft_ms").is_not_null())
    groups: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    values = np.sort(ttft["ttft_ms"].to_numpy())
    if len(values):
        groups["all requests"] = (values, np.arange(1, len(values) + 1) / len(values))
    return add_curves(fig, groups, lines=category_lines(list(groups), "all requests"))


def _ttft_vs_uncached(ok: pl.DataFrame, cost: dict[str, Any] | None) -> Fig:
    t = _thin(ok.filter(pl.col("ttft_ms").is_not_null()).with_columns(
        uncached=pl.col("prompt_tokens") - pl.col("cached_tokens").fill_null(0)))
    fig = new_figure(x_title="uncached prompt tokens (prompt - cached)", y_title="TTFT (ms)")
    fig.add_scatter(x=t["uncached"].to_numpy(), y=t["ttft_ms"].to_numpy(), mode="markers", name="request",
                    marker={"size": 5, "opacity": 0.6})
    if cost is not None and t.height:
        lo, hi = float(t["uncached"].min() or 0), float(t["uncached"].max() or 0)  # type: ignore[arg-type]
        a_ms, b_ms = 1000 * float(cost.get("a_s") or 0), 1000 * float(cost.get("b_s_per_token") or 0)
        fig.add_scatter(x=[lo, hi], y=[a_ms + b_ms * lo, a_ms + b_ms * hi], mode="lines",
                        name="cost model a + b x uncached", line={"color": "#d62728"})
    return fig


def _plugin(s: Section, p: dict[str, Any]) -> None:
    s.values["plugin"] = {
        "mode": str(p.get("mode", "")), "evictions": fmt.count(p.get("evictions")),
        "mean_us": fmt.num(p.get("decision_mean_us")), "p50_us": fmt.num(p.get("decision_p50_us")),
        "p99_us": fmt.num(p.get("decision_p99_us")), "fallbacks": fmt.count(p.get("fallbacks")),
        "reasons": [str(r) for r in (p.get("fallback_reasons") or [])],
    }
    by_cat: dict[str, Any] = p.get("evictions_by_category") or {}
    s.tables["plugin"] = Table(columns=["category of the evicted block", "evictions"],
                               rows=[[str(k), fmt.count(v)] for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])])
    s.headline.append(Headline(f"plugin eviction decision mean / P99 ({p.get('mode', '')})",
                               f"{s.values['plugin']['mean_us']} / {s.values['plugin']['p99_us']} us",
                               "79 us per eviction"))
