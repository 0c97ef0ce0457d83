"""`kvtrace study`: many traces (windows of a week, clusters, to-C and to-B) side by side.

Phase 1, one task per trace (its own run folder OUT/runs/NAME): ingest, analyze, fit, the per-run HTML
report, and LRU vs WA (its own fit) over the study's capacities. Phase 2, one task per window after the
first: WA with the PREVIOUS window's policy file on this window (the honest test of "fit on the previous
hour"). Both phases fan out through tongyi_trace.executor (local pool or Ray). Windows are ordered by file
name. Artifacts in OUT/ (written as tasks finish, tables at the end):
    windows.jsonl     one line per finished window (or its error), appended as they finish
    windows.parquet   window, trace, requests, duration, ideal hit ratio, error
    fits.parquet      window x category: reuse probability p, mean reuse time, life
    transfer.parquet  window x capacity x policy (lru, wa-own, wa-prev): hit ratios
    study.json        all of it plus the drift figures; index.html: the cross-trace page
"""

from __future__ import annotations

import glob
import html
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import polars as pl

from tongyi_trace.atomic import atomic_write_text
from tongyi_trace.errors import UsageError
from tongyi_trace.executor import ExecutorOptions, TaskOutcome, check_options, map_tasks
from tongyi_trace.models import DEFAULT_MODEL
from tongyi_trace.resources import reports_dir
from tongyi_trace.run import run_root, write_json
from tongyi_trace.schemas import STUDY_SCHEMA

TRACE_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")
DEFAULT_CAPACITIES = "10%,1L"


@dataclass(frozen=True)
class StudyOptions:
    """`kvtrace study`'s options."""

    capacities: str = DEFAULT_CAPACITIES  # simulate LRU / WA at these (simulate's units)
    model: str = DEFAULT_MODEL  # model preset of the analyses and x HBM capacities
    executor: ExecutorOptions = field(default_factory=ExecutorOptions)


@dataclass
class StudyResult:
    """The cross-trace tables and where they were written."""

    windows: list[dict[str, Any]]
    fits: list[dict[str, Any]]
    transfer: list[dict[str, Any]]
    summary: dict[str, Any]
    out_dir: Path


def window_name(path: Path) -> str:
    """A trace file's window name: its file name without the trace suffix."""
    name = path.name
    for suf in TRACE_SUFFIXES:
        if name.endswith(suf):
            return name[: -len(suf)]
    return path.stem


def find_traces(spec: str) -> list[Path]:
    """The trace files SPEC names (a folder: its trace files; else a glob), sorted by name (= window order)."""
    folder = Path(spec)
    if folder.is_dir():
        paths = [p for p in folder.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES)]
        where = f"{spec}: no trace files ({', '.join(TRACE_SUFFIXES)})"
    else:
        paths = [Path(p) for p in glob.glob(spec) if Path(p).is_file()]
        where = f"{spec}: no file matches"
    if not paths:
        raise UsageError(f"{where}; give a folder of traces or a glob such as 'traces/day1-*.jsonl'")
    paths = sorted(paths, key=lambda p: p.name)
    names = [window_name(p) for p in paths]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"{spec}: several traces are named {', '.join(dup)}; give each window its own file name")
    return [p.resolve() for p in paths]


def run_study(spec: str, out_dir: Path, opts: StudyOptions | None = None,
              on_progress: Callable[[str, int, int], None] | None = None) -> StudyResult:
    """Study every trace SPEC names into OUT_DIR (see the module doc); ON_PROGRESS(what, done, total)."""
    opts = opts or StudyOptions()
    check_options(opts.executor)
    traces = find_traces(spec)
    out_dir = out_dir.resolve()
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"-o {out_dir}: exists and is not a folder; give the study a folder")
    root = run_root(out_dir)
    if root is not None:
        where = "is a run folder" if root == out_dir else f"is inside the run folder {root}"
        raise UsageError(f"-o {out_dir}: {where}; give the study a folder of its own (it makes a run folder "
                         "per trace under it)")
    try:
        (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"-o {out_dir}: cannot create the study folder ({e.strerror}); choose another") from None
    t0 = time.perf_counter()
    jsonl = out_dir / "windows.jsonl"
    jsonl.write_text("")
    shared = {"capacities": opts.capacities, "model": opts.model}
    tasks = [(i, window_name(p), str(p), str(out_dir / "runs" / window_name(p))) for i, p in enumerate(traces)]
    done: dict[int, dict[str, Any]] = {}

    def window_done(out: TaskOutcome) -> None:
        i, name, trace, run = tasks[out.index]
        doc = out.value if out.ok else {"window": name, "index": i, "trace": trace, "run": run, "error": out.error}
        done[out.index] = doc
        with jsonl.open("a") as f:
            f.write(json.dumps(doc) + "\n")
        if on_progress:
            on_progress(f"window {name}", len(done), len(tasks))

    s1 = map_tasks(_window_task, tasks, shared, window_done, opts.executor)
    docs = [done[i] for i in range(len(tasks))]
    pairs = [(i, docs[i]["window"], docs[i]["run"], docs[i - 1]["window"], docs[i - 1]["policy_path"])
             for i in range(1, len(docs)) if "error" not in docs[i] and "error" not in docs[i - 1]]
    transfer_rows: list[dict[str, Any]] = [r for d in docs for r in d.get("transfer", [])]
    transfer_errors: list[dict[str, Any]] = []

    def transfer_done(out: TaskOutcome) -> None:
        if out.ok:
            transfer_rows.extend(out.value)
        else:
            transfer_errors.append({"window": pairs[out.index][1], "error": out.error})
        if on_progress:
            on_progress(f"next-window check {pairs[out.index][1]}", out.index + 1, len(pairs))

    s2 = map_tasks(_transfer_task, pairs, shared, transfer_done, opts.executor)
    order = {d["window"]: d["index"] for d in docs}
    transfer_rows.sort(key=lambda r: (order[r["window"]], r["capacity_blocks"], r["policy"]))
    windows = [{k: v for k, v in d.items() if k not in ("fits", "transfer")} for d in docs]
    fits = [f for d in docs for f in d.get("fits", [])]
    summary = {
        "schema": STUDY_SCHEMA, "spec": spec, "num_windows": len(docs), "capacities": opts.capacities,
        "executor": s1.executor, "num_failed": s1.num_failed + s2.num_failed, "failed_transfer": transfer_errors,
        "drift": drift(fits, windows), "transfer_gain": transfer_gain(transfer_rows),
        "elapsed_s": time.perf_counter() - t0,
    }
    result = StudyResult(windows, fits, transfer_rows, summary, out_dir)
    write_study(result)
    return result


def drift(fits: list[dict[str, Any]], windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per category, min / max / relative spread ((max - min) / mean) of p, mean reuse time and life over the
    windows; the same for the ideal hit ratio."""
    out: dict[str, Any] = {"categories": {}}
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for f in fits:
        by_cat.setdefault(f["category"], []).append(f)
    for cat, rows in sorted(by_cat.items()):
        out["categories"][cat] = {k: _spread([r[k] for r in rows]) for k in ("reuse_prob", "mean_reuse_s", "life_s")}
    out["ideal_hit_ratio"] = _spread([w.get("ideal_hit_ratio") for w in windows])
    return out


def _spread(values: list[Any]) -> dict[str, float | int | None]:
    xs = [float(v) for v in values if v is not None and v == v]
    if not xs:
        return {"num_windows": 0, "min": None, "max": None, "rel_spread": None}
    mean = sum(xs) / len(xs)
    return {"num_windows": len(xs), "min": min(xs), "max": max(xs),
            "rel_spread": (max(xs) - min(xs)) / mean if mean else None}


def transfer_gain(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per capacity, the mean over windows of (WA with the previous window's fit - LRU) and (own fit - LRU)."""
    hit = {(r["window"], r["capacity"], r["policy"]): r["hit_ratio"] for r in rows}
    out: dict[str, Any] = {}
    for cap in dict.fromkeys(r["capacity"] for r in rows):
        wins = [w for (w, c, p) in hit if c == cap and p == "wa-prev" and (w, c, "lru") in hit]
        if not wins:
            continue
        prev = [hit[(w, cap, "wa-prev")] - hit[(w, cap, "lru")] for w in wins]
        own = [hit[(w, cap, "wa-own")] - hit[(w, cap, "lru")] for w in wins if (w, cap, "wa-own") in hit]
        out[cap] = {"num_windows": len(wins), "wa_prev_minus_lru": sum(prev) / len(prev),
                    "wa_own_minus_lru": sum(own) / len(own) if own else None}
    return out


def write_study(res: StudyResult) -> None:
    """OUT/windows.parquet, fits.parquet, transfer.parquet, study.json and index.html."""
    out = res.out_dir
    pl.DataFrame(res.windows, infer_schema_length=None).write_parquet(out / "windows.parquet")
    pl.DataFrame(res.fits, schema=FIT_SCHEMA).write_parquet(out / "fits.parquet")
    pl.DataFrame(res.transfer, schema=TRANSFER_SCHEMA).write_parquet(out / "transfer.parquet")
    write_json(out / "study.json", {**res.summary, "windows": res.windows, "fits": res.fits,
                                    "transfer": res.transfer})
    write_page(res, out / "index.html")


FIT_SCHEMA = {"window": pl.String, "index": pl.Int64, "category": pl.String, "reuse_prob": pl.Float64,
              "mean_reuse_s": pl.Float64, "life_s": pl.Float64, "num_samples": pl.Int64, "fallback": pl.Boolean}
TRANSFER_SCHEMA = {"window": pl.String, "index": pl.Int64, "policy": pl.String, "fitted_on": pl.String,
                   "capacity": pl.String, "capacity_blocks": pl.Int64, "hit_ratio": pl.Float64,
                   "token_hit_ratio": pl.Float64}


# ---- the tasks (module level: they run in the executor's workers) --------------------------------------


def _window_task(task: tuple[int, str, str, str], shared: Mapping[str, Any]) -> dict[str, Any]:
    """Ingest + analyze + fit + report + LRU vs WA (own fit) of one trace into its own run folder."""
    from tongyi_trace.analysis.runner import run_analyses
    from tongyi_trace.fit.policy_fit import fit_policy
    from tongyi_trace.report.render import render_report
    from tongyi_trace.run import open_run
    from tongyi_trace.trace.ingest import ingest_trace

    index, name, trace, run_path = task
    prov = ingest_trace(trace, run_path, overwrite=True)
    run = open_run(run_path)
    run_analyses(run)
    policy_path = Path(run_path) / "fit" / "policy.json"
    fit = fit_policy(run_path, policy_path, jobs=1)
    sweep = _sweep(run_path, ["lru", "wa"], policy_path, shared, write=True)
    report = render_report(run)
    fits = [{"window": name, "index": index, "category": r["category"], "reuse_prob": r["reuse_prob"],
             "mean_reuse_s": r["mean_reuse_s"], "life_s": r["life_s"], "num_samples": r["train_num_samples"],
             "fallback": bool(r["fallback"])} for r in fit.rows if r.get("train_num_samples")]
    rows = [_transfer_row(name, index, r, "lru" if r["policy"] == "lru" else "wa-own", name) for r in sweep.rows]
    return {"window": name, "index": index, "trace": trace, "run": run_path, "policy_path": str(policy_path),
            "report": str(report), "num_requests": prov["num_requests"], "duration_s": prov.get("duration_s"),
            "ideal_hit_ratio": sweep.summary["ideal_hit_ratio"], "fits": fits, "transfer": rows}


def _transfer_task(task: tuple[int, str, str, str, str], shared: Mapping[str, Any]) -> list[dict[str, Any]]:
    """WA on one window with the previous window's policy file."""
    index, name, run_path, prev_name, prev_policy = task
    sweep = _sweep(run_path, ["wa"], Path(prev_policy), shared, write=False)
    return [_transfer_row(name, index, r, "wa-prev", prev_name) for r in sweep.rows]


def _sweep(run_path: str, policies: list[str], policy_path: Path, shared: Mapping[str, Any], write: bool) -> Any:
    from tongyi_trace.run import open_run
    from tongyi_trace.sim.sweep import SimulateOptions, build_config, run_sweep

    opts = SimulateOptions(policies=",".join(policies), capacities=shared["capacities"], params_path=policy_path,
                           model=shared["model"], jobs=1)  # as `kvtrace simulate` (cost model of the preset)
    return run_sweep(open_run(run_path), replace(build_config(opts), write=write))


def _transfer_row(name: str, index: int, r: dict[str, Any], policy: str, fitted_on: str) -> dict[str, Any]:
    return {"window": name, "index": index, "policy": policy, "fitted_on": fitted_on, "capacity": r["capacity"],
            "capacity_blocks": r["capacity_blocks"], "hit_ratio": r["hit_ratio"],
            "token_hit_ratio": r["token_hit_ratio"]}


# ---- the cross-trace page: one self-contained HTML file (plotly.js inline, no network) ----------------

TEMPLATE_NAME = "plotly_white"  # as the report's figures


def write_page(res: StudyResult, path: Path) -> None:
    """The study's HTML page: drift of the fits and the ideal hit ratio, and the next-window check."""
    import plotly.graph_objects as go
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    from tongyi_trace.report.figures import label, labels

    names = labels([w["window"] for w in res.windows])  # shown literally by Plotly, never read as its tags
    window_label = dict(zip((w["window"] for w in res.windows), names, strict=True))
    figs: list[tuple[str, go.Figure]] = []
    ideal = go.Figure(go.Scatter(x=names, y=[w.get("ideal_hit_ratio") for w in res.windows], mode="lines+markers",
                                 name="ideal"))
    figs.append(("Ideal hit ratio (unlimited cache) per window", ideal))
    for key, title in (("reuse_prob", "Reuse probability p per category"),
                       ("mean_reuse_s", "Mean reuse time (s) per category"),
                       ("life_s", "Lifespan regulator life (s) per category")):
        fig = go.Figure()
        for cat in sorted({f["category"] for f in res.fits}):
            by_w = {window_label[f["window"]]: f[key] for f in res.fits if f["category"] == cat}
            fig.add_trace(go.Scatter(x=names, y=[by_w.get(n) for n in names], mode="lines+markers",
                                     name=label(cat)))
        figs.append((title, fig))
    for cap in dict.fromkeys(r["capacity"] for r in res.transfer):
        fig = go.Figure()
        for pol, title_of in (("lru", "LRU"), ("wa-own", "WA, fitted on the same window"),
                              ("wa-prev", "WA, fitted on the previous window")):
            by_w = {window_label[r["window"]]: r["hit_ratio"] for r in res.transfer
                    if r["capacity"] == cap and r["policy"] == pol}
            fig.add_trace(go.Scatter(x=names, y=[by_w.get(n) for n in names], mode="lines+markers", name=title_of))
        figs.append((f"Hit ratio at capacity {cap}: does the previous window's fit hold?", fig))
    y_titles = ["ideal hit ratio", "reuse probability p", "mean reuse time (s)", "life_s (s)"]
    parts = []
    for i, (title, fig) in enumerate(figs):
        fig.update_layout(template=TEMPLATE_NAME, height=320, margin={"l": 60, "r": 20, "t": 20, "b": 50},
                          xaxis_title="window", yaxis_title=y_titles[i] if i < len(y_titles) else "hit ratio",
                          legend={"orientation": "h", "y": -0.25})
        parts.append(f"<h2>{html.escape(title)}</h2>" + pio.to_html(fig, full_html=False, include_plotlyjs=False))
    rows = "".join(
        f"<tr><td>{html.escape(w['window'])}</td><td>{w.get('num_requests', '')}</td>"
        f"<td>{_fmt(w.get('ideal_hit_ratio'))}</td><td>{html.escape(w.get('error') or '')}</td>"
        f"<td>{_link(w.get('report'), path.parent)}</td></tr>" for w in res.windows)
    gain = "".join(f"<li>{html.escape(c)}: WA with the previous window's fit - LRU = {_fmt(g['wa_prev_minus_lru'])},"
                   f" WA with its own fit - LRU = {_fmt(g['wa_own_minus_lru'])} (mean of {g['num_windows']} "
                   f"window{'' if g['num_windows'] == 1 else 's'})</li>"
                   for c, g in res.summary["transfer_gain"].items())
    css = (reports_dir() / "report.css").read_text()  # the report's style: one look for both pages
    n = len(res.windows)
    page = (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>kvtrace study</title>"
            f"<script>{get_plotlyjs()}</script><style>{css}</style></head><body><header><h1>kvtrace study: "
            f"{n} window{'' if n == 1 else 's'}</h1></header><main><ul class=\"kv-recommendation\">{gain}</ul>"
            f"<table class=\"kv-table\"><thead><tr><th>window</th><th>requests</th><th>ideal hit ratio</th>"
            f"<th>error</th><th>report</th></tr></thead><tbody>{rows}</tbody></table>{''.join(parts)}</main>"
            f"<footer><p>kvtrace study &middot; self-contained page, works offline.</p></footer></body></html>")
    atomic_write_text(path, page)


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.4f}"


def _link(report: str | None, base: Path) -> str:
    if not report:
        return ""
    rel = Path(report).relative_to(base) if Path(report).is_relative_to(base) else Path(report)
    return f'<a href="{html.escape(quote(rel.as_posix()), quote=True)}">report</a>'
