"""Section: the embedded simulator's sweep, hit ratio vs capacity for every policy with the exact
one-pass LRU curve, the oracle and the ideal; WA against the best baseline; the WA ablation; QTTFT
estimates and eviction decision costs (paper section 5, Fig 23-24 and the ablation). Artifacts in
RUN_DIR/sim/: summary.json, results.parquet (or results.jsonl while a sweep runs), lru_curve.parquet,
per_category.parquet (docs/artifacts/sim.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tongyi_trace.report import fmt
from tongyi_trace.report.artifacts import read_parquet, read_results, read_versioned
from tongyi_trace.report.figures import Fig, downsample, label, new_figure
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.run import RunDir
from tongyi_trace.schemas import SIM_SCHEMA
from tongyi_trace.sim import registry
from tongyi_trace.sim.guarded import lru_time_share
from tongyi_trace.sim.recommend import report_sweep
from tongyi_trace.sim.registry import (
    COLORS,
    FITTED,
    ORACLE_VARIANTS,
    OTHER_COLOR,
    PAPER_WA_GAIN_POINTS,
    WA_ABLATION,
    Policy,
)

REMEDY = "re-run 'kvtrace simulate RUN_DIR'"
BASELINES = [p.value for p in registry.BASELINES]
ABLATION = [Policy.WA.value, *WA_ABLATION]
[DEAD_ORACLE] = ORACLE_VARIANTS
COLUMNS = ["policy", "capacity", "capacity_blocks", "hit_ratio", "token_hit_ratio", "num_evictions",
           "evict_decision_ns", "refs_per_s", "qttft_mean_s", "qttft_p50_s", "qttft_p99_s"]
# absent from sweeps of older kvtrace versions (the guard's: from WA rows only)
OPTIONAL = ["orphaned_refs", "num_refs", "base_policy", "guard_switches", "refits", "guard_time_policy_s",
            "guard_time_lru_s"]


def build(run: RunDir) -> list[Section]:
    """The simulation section, or nothing when `kvtrace simulate` was not run."""
    sweep = report_sweep(run.path)
    if sweep is None:
        return []
    d = sweep.path
    results = _results(d)
    if results is None:
        return []
    summary = read_versioned(d / "summary.json", SIM_SCHEMA, REMEDY) or {}  # absent while the sweep runs
    s = Section(key="sim", title="Eviction policies in the simulator (kvtrace simulate)", paper_ref="section 5",
                definition="Requests in arrival order; a request's hit is the longest prefix of its blocks present in "
                           "the cache; its blocks are pinned while served, then evictable with the prefix head most "
                           "recent. Hit ratio over block references; QTTFT from the documented cost model of one "
                           "serving instance (FIFO queue, prefill = a + b x uncached tokens).")
    ideal = summary.get("ideal_hit_ratio")
    curve = read_parquet(d / "lru_curve.parquet", REMEDY)
    s.figures["hit"] = _hit_figure(results, curve, ideal, summary.get("peak_live_blocks"))
    if results["qttft_mean_s"].drop_nulls().len():
        s.figures["qttft"] = _qttft_figure(results)
    caps = results.select("capacity", "capacity_blocks").unique(maintain_order=True).sort("capacity_blocks")
    policies = [p for p in _policy_order(results["policy"].unique().to_list()) if p not in ABLATION[1:]]
    s.tables["hit"] = _pivot(results, caps, policies, "hit_ratio")
    gains = _wa_gains(results, caps)
    exported = FITTED if FITTED in set(results["policy"].to_list()) else Policy.WA.value
    policy_gain = _policy_gains(results, caps, exported)
    if policy_gain:
        s.figures["gain"] = _gain_figure(policy_gain, exported)
        s.tables["gain"] = Table(
            columns=["capacity", "blocks", exported, "- LRU", "best baseline", f"{exported} - best",
                     "oracle - LRU (headroom)", "gap closed", f"{DEAD_ORACLE} - LRU"],
            rows=[[g["capacity"], fmt.count(g["blocks"]), fmt.ratio(g["hit"]), _vs_lru(g),
                   g["best"], f"{100 * g['vs_best']:+.2f}", fmt.NA if g["headroom"] is None else
                   f"{100 * g['headroom']:.2f}", fmt.NA if g["closed"] is None else f"{100 * g['closed']:.0f}%",
                   fmt.NA if g["dead_headroom"] is None else f"{100 * g['dead_headroom']:.2f}"]
                  for g in policy_gain],
            caption="Hit-ratio points (1.0 = 100 points); '- LRU' with its 95% interval (+- half its width) from "
                    "the paired session bootstrap when the sweep has intervals. Gap closed = share of the "
                    "LRU-to-oracle gap the exported "
                    f"policy closes. {DEAD_ORACLE} - LRU (with -p {DEAD_ORACLE}): what knowing which blocks are "
                    "never used again would add to LRU, the most any predictor of dead blocks can give; the rest "
                    "of the headroom needs to know when a block returns.")
        # the Recommendation's rule: a loss with an interval counts when the whole interval is below 0
        losses = [g["capacity"] for g in policy_gain
                  if (g["vs_lru_interval_pp"][1] < 0 if g.get("vs_lru_interval_pp") else g["vs_lru"] < 0)]
        s.values["gain_verdict"] = (
            f"The exported policy ({exported}) loses to LRU at {', '.join(losses)}: run LRU there, or re-fit with "
            f"'kvtrace fit RUN --capacity ...' so that the policy file chooses per capacity." if losses else
            f"The exported policy ({exported}) is at least as good as LRU at every simulated capacity.")
    if "orphaned_refs" in results.columns and results["orphaned_refs"].drop_nulls().len():
        s.tables["orphans"] = _orphan_table(results, caps)
    if gains:
        s.tables["wa"] = Table(columns=["capacity", "blocks", "WA", "best baseline", "its hit ratio", "WA - best"],
                               rows=[[g["capacity"], fmt.count(g["blocks"]), fmt.ratio(g["wa"]), g["best"],
                                      fmt.ratio(g["best_hit"]), f"{100 * g['gain']:+.2f} points"] for g in gains])
    abl = [p for p in ABLATION if p in set(results["policy"].to_list())]
    if len(abl) > 1 and abl[0] == Policy.WA:
        s.tables["ablation"] = _ablation(results, caps, abl)
    per_cat = read_parquet(d / "per_category.parquet", REMEDY)
    if per_cat is not None and gains:
        s.tables["per_category"] = _per_category(per_cat, gains[0])
    guard = _guard_table(results, caps)
    if guard is not None:
        s.tables["guard"] = guard
    s.tables["cost"] = _cost_table(results, policies + abl[1:])
    s.values.update({
        "ideal": fmt.ratio(ideal), "peak_live": fmt.count(summary.get("peak_live_blocks")),
        "num_refs": fmt.count(summary.get("num_refs")), "partial": not (d / "results.parquet").is_file(),
        "num_results": results.height, "model": str(summary.get("model") or ""),
        "gain_small": f"{100 * gains[0]['gain']:+.2f}" if gains else None,
        "gain_large": f"{100 * gains[-1]['gain']:+.2f}" if gains else None,
        "cap_small": gains[0]["capacity"] if gains else "", "cap_large": gains[-1]["capacity"] if gains else "",
        "best_small": gains[0]["best"] if gains else "",
        "cost_model": _cost_caption(summary.get("cost_model")),
    })
    if gains:
        s.headline = [
            Headline(f"WA - best baseline, smallest capacity ({gains[0]['capacity']})",
                     f"{s.values['gain_small']} points",
                     f"+{PAPER_WA_GAIN_POINTS[0]} to +{PAPER_WA_GAIN_POINTS[1]} points, shrinking with capacity"),
            Headline(f"WA - best baseline, largest capacity ({gains[-1]['capacity']})",
                     f"{s.values['gain_large']} points"),
        ]
    if policy_gain and exported == FITTED:  # the tool's answer: what the policy file chose per capacity
        for g, which in ((policy_gain[0], "smallest"), (policy_gain[-1], "largest")):
            s.headline.append(Headline(f"fitted (the policy file's choice) - best baseline, {which} capacity "
                                       f"({g['capacity']})", f"{100 * g['vs_best']:+.2f} points"))
    return [s]


def _results(d: Path) -> pl.DataFrame | None:
    """The simulate sweep's rows so far (report.artifacts.read_results)."""
    return read_results(d, COLUMNS, OPTIONAL, "simulation", REMEDY)


def _policy_order(names: list[str]) -> list[str]:
    known = [*BASELINES, Policy.WA.value, FITTED, DEAD_ORACLE, Policy.ORACLE.value, *ABLATION[1:]]
    return [p for p in known if p in names] + sorted(set(names) - set(known))


def _hit_figure(results: pl.DataFrame, curve: pl.DataFrame | None, ideal: float | None,
                peak_live: float | None) -> Fig:
    fig = new_figure(x_title="cache capacity (blocks, log scale)", y_title="hit ratio (blocks)", height_px=400)
    fig.update_xaxes(type="log")
    fig.update_yaxes(rangemode="tozero", tickformat=".0%")
    lo, hi = float(results["capacity_blocks"].min() or 1) / 4, float(results["capacity_blocks"].max() or 1) * 2  # type: ignore[arg-type]
    if curve is not None and curve.height:  # the exact curve around the swept capacities
        c = curve.filter(pl.col("capacity_blocks").is_between(max(lo, 1), hi))
        x, y = downsample(c["capacity_blocks"].to_numpy(), c["hit_ratio"].to_numpy())
        fig.add_scatter(x=x, y=y, mode="lines", name="LRU, exact one-pass curve",
                        line={"color": COLORS[Policy.LRU], "width": 1, "shape": "hv"}, opacity=0.5)
    for pol in _policy_order(results["policy"].unique().to_list()):
        part = results.filter(pl.col("policy") == pol).sort("capacity_blocks")
        fig.add_scatter(x=part["capacity_blocks"].to_numpy(), y=part["hit_ratio"].to_numpy(), mode="lines+markers",
                        name=label(pol), line={"color": COLORS.get(pol, OTHER_COLOR),
                                               "dash": "dot" if pol in ABLATION[1:] else "solid",
                                               "width": 3 if pol in (Policy.WA, FITTED, Policy.ORACLE) else 1.5})
    if ideal is not None:
        fig.add_hline(y=float(ideal), line={"dash": "dash", "color": "#444"}, annotation_text="ideal (infinite cache)")
    if peak_live:
        fig.update_layout(shapes=[*fig.layout.get("shapes", []), {
            "type": "line", "xref": "x", "x0": float(peak_live), "x1": float(peak_live), "yref": "paper",
            "y0": 0, "y1": 1, "line": {"dash": "dot", "color": COLORS[Policy.ORACLE]}}],
            annotations=[*fig.layout.get("annotations", []), {
                "xref": "x", "x": float(np.log10(float(peak_live))), "yref": "paper", "y": 0.02, "xanchor": "left",
                "text": "oracle peak live set", "showarrow": False, "font": {"color": COLORS[Policy.ORACLE]}}])
    return fig


def _qttft_figure(results: pl.DataFrame) -> Fig:
    fig = new_figure(x_title="cache capacity (blocks, log scale)", y_title="mean QTTFT (s, estimated)")
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    for pol in _policy_order(results["policy"].unique().to_list()):
        if pol in ABLATION[1:]:
            continue
        part = results.filter(pl.col("policy") == pol).sort("capacity_blocks")
        fig.add_scatter(x=part["capacity_blocks"].to_numpy(), y=part["qttft_mean_s"].to_numpy(), mode="lines+markers",
                        name=label(pol), line={"color": COLORS.get(pol, OTHER_COLOR)})
    return fig


def _pivot(results: pl.DataFrame, caps: pl.DataFrame, policies: list[str], col: str) -> Table:
    cell = {(r["policy"], r["capacity"]): r[col] for r in results.iter_rows(named=True)}
    return Table(columns=["capacity", "blocks", *policies],
                 rows=[[str(c["capacity"]), fmt.count(c["capacity_blocks"]),
                        *[fmt.ratio(cell.get((p, c["capacity"]))) for p in policies]]
                       for c in caps.iter_rows(named=True)])


def _ablation(results: pl.DataFrame, caps: pl.DataFrame, variants: list[str]) -> Table:
    """Hit ratio of WA and each variant per capacity, the variants with their difference to WA."""
    cell = {(r["policy"], r["capacity"]): r["hit_ratio"] for r in results.iter_rows(named=True)}
    rows = []
    for c in caps.iter_rows(named=True):
        wa = cell.get(("wa", c["capacity"]))
        row = [str(c["capacity"]), fmt.count(c["capacity_blocks"]), fmt.ratio(wa)]
        for v in variants[1:]:
            hit = cell.get((v, c["capacity"]))
            row.append(fmt.ratio(hit) + ("" if hit is None or wa is None else f" ({100 * (hit - wa):+.2f})"))
        rows.append(row)
    return Table(columns=["capacity", "blocks", "wa", *[f"{v} (points vs wa)" for v in variants[1:]]], rows=rows)


def _guard_table(results: pl.DataFrame, caps: pl.DataFrame) -> Table | None:
    """Per guarded run (WA and fitted-as-WA rows, the ablation's variants left out), in capacity order: the
    guard's switches, the refits and the share of the trace spent in LRU order; None without guarded rows."""
    if "guard_time_lru_s" not in results.columns:
        return None
    order = {c: i for i, c in enumerate(caps["capacity"].to_list())}
    rows = []
    for r in sorted(results.filter(pl.col("guard_time_lru_s").is_not_null()
                                   & ~pl.col("policy").is_in(list(WA_ABLATION))).iter_rows(named=True),
                    key=lambda r: (r["policy"] != Policy.WA.value, order.get(r["capacity"], 0))):
        rows.append([r["policy"], str(r["capacity"]), fmt.count(r["guard_switches"]), fmt.count(r["refits"]),
                     fmt.pct(lru_time_share(r))])
    if not rows:
        return None
    return Table(columns=["policy", "capacity", "guard switches", "refits", "time in LRU order"], rows=rows,
                 caption="The shadow-LRU guard (on by default for WA, docs/guard.md): 0 switches = the policy ran "
                         "as fitted; time in LRU order = the share of the trace the guard made the cache evict "
                         "in LRU order, where a sampled LRU was ahead.")


def _per_category(per_cat: pl.DataFrame, gain: dict[str, Any]) -> Table:
    """Per category at GAIN's capacity: WA against the best baseline there."""
    at = per_cat.filter(pl.col("capacity") == gain["capacity"])
    wa = {r["category"]: r for r in at.filter(pl.col("policy") == "wa").iter_rows(named=True)}
    best = {r["category"]: r for r in at.filter(pl.col("policy") == gain["best"]).iter_rows(named=True)}
    rows = []
    for cat in sorted(wa):
        w, b = wa[cat], best.get(cat)
        rows.append([str(cat), fmt.count(w["num_refs"]), fmt.ratio(w["hit_ratio"]),
                     fmt.ratio(b["hit_ratio"] if b else None),
                     fmt.NA if b is None else f"{100 * (w['hit_ratio'] - b['hit_ratio']):+.2f} points"])
    return Table(columns=["category", "block refs", "WA", gain["best"], "WA - " + gain["best"]], rows=rows,
                 caption=f"Per category at capacity {gain['capacity']} ({fmt.count(gain['blocks'])} blocks).")


def _wa_gains(results: pl.DataFrame, caps: pl.DataFrame) -> list[dict[str, Any]]:
    cell = {(r["policy"], r["capacity"]): r["hit_ratio"] for r in results.iter_rows(named=True)}
    gains = []
    for c in caps.iter_rows(named=True):
        wa = cell.get(("wa", c["capacity"]))
        base = [(cell[(p, c["capacity"])], p) for p in BASELINES if cell.get((p, c["capacity"])) is not None]
        if wa is None or not base:
            continue
        best_hit, best = max(base, key=lambda hp: hp[0])  # ties: the first in BASELINES order
        gains.append({"capacity": str(c["capacity"]), "blocks": c["capacity_blocks"], "wa": wa, "best": best,
                      "best_hit": best_hit, "gain": wa - best_hit})
    return gains


def _policy_gains(results: pl.DataFrame, caps: pl.DataFrame, exported: str) -> list[dict[str, Any]]:
    """Per capacity: the exported policy's hit ratio, its gain over LRU and over the best baseline, the
    oracle's headroom over LRU, the share of that gap the exported policy closes, and (when simulated)
    the part of the headroom that knowing which blocks are never used again gives (oracle-dead - LRU)."""
    from tongyi_trace.fit.tune import lru_gap_closed

    cell = {(r["policy"], r["capacity"]): r["hit_ratio"] for r in results.iter_rows(named=True)}
    spread = {(r["policy"], r["capacity"]): (r["gain_vs_lru_lo_pp"], r["gain_vs_lru_hi_pp"])
              for r in results.iter_rows(named=True) if r.get("gain_vs_lru_lo_pp") is not None}
    out = []
    for c in caps.iter_rows(named=True):
        cap = str(c["capacity"])
        hit, lru, orc = cell.get((exported, cap)), cell.get(("lru", cap)), cell.get(("oracle", cap))
        dead = cell.get((DEAD_ORACLE, cap))
        base = [(cell[(p, cap)], p) for p in BASELINES if cell.get((p, cap)) is not None]
        if hit is None or lru is None or not base:
            continue
        best_hit, best = max(base, key=lambda hp: hp[0])
        closed = lru_gap_closed(hit, lru, orc) if orc is not None else None
        out.append({"capacity": cap, "blocks": c["capacity_blocks"], "hit": hit, "vs_lru": hit - lru,
                    "best": best, "vs_best": hit - best_hit, "headroom": None if orc is None else orc - lru,
                    "closed": None if closed is None or not np.isfinite(closed) else closed,
                    "dead_headroom": None if dead is None else dead - lru,
                    "vs_lru_interval_pp": spread.get((exported, cap))})
    return out


def _vs_lru(g: dict[str, Any]) -> str:
    """The exported policy's gain over LRU in points, '+1.20 +- 0.31' when the sweep has its interval."""
    iv = g.get("vs_lru_interval_pp")
    point = f"{100 * g['vs_lru']:+.2f}"
    return point if iv is None else f"{point} +- {(iv[1] - iv[0]) / 2:.2f}"


def _gain_figure(gains: list[dict[str, Any]], exported: str) -> Fig:
    fig = new_figure(x_title="cache capacity (blocks, log scale)", y_title="hit-ratio points", height_px=320)
    fig.update_xaxes(type="log")
    x = [g["blocks"] for g in gains]
    fig.add_scatter(x=x, y=[100 * g["vs_lru"] for g in gains], mode="lines+markers", name=f"{exported} - LRU",
                    line={"color": COLORS[Policy.LRU], "width": 3})
    fig.add_scatter(x=x, y=[100 * g["vs_best"] for g in gains], mode="lines+markers",
                    name=f"{exported} - best baseline", line={"color": COLORS[Policy.WA], "width": 3})
    if all(g["headroom"] is not None for g in gains):
        fig.add_scatter(x=x, y=[100 * g["headroom"] for g in gains], mode="lines", name="oracle - LRU (headroom)",
                        line={"color": COLORS[Policy.ORACLE], "dash": "dash"})
    if all(g["dead_headroom"] is not None for g in gains):
        fig.add_scatter(x=x, y=[100 * g["dead_headroom"] for g in gains], mode="lines",
                        name=f"{DEAD_ORACLE} - LRU (knowing which blocks die)",
                        line={"color": COLORS[DEAD_ORACLE], "dash": "dot"})
    fig.add_hline(y=0.0, line={"color": "#444", "width": 1})
    return fig


def _orphan_table(results: pl.DataFrame, caps: pl.DataFrame) -> Table:
    """Share of block references that met a cached block behind a missing ancestor, per policy."""
    cell = {(r["policy"], r["capacity"]): r for r in results.iter_rows(named=True)}
    policies = _policy_order(results["policy"].unique().to_list())
    rows = []
    for c in caps.iter_rows(named=True):
        row = [str(c["capacity"])]
        for p in policies:
            r = cell.get((p, c["capacity"]))
            refs = r.get("num_refs") if r else None
            row.append(fmt.NA if not r or r.get("orphaned_refs") is None or not refs
                       else f"{100 * r['orphaned_refs'] / refs:.2f}%")
        rows.append(row)
    return Table(columns=["capacity", *policies], rows=rows,
                 caption="Orphaned references: a cached block that could not hit because an ancestor of its "
                         "prefix was evicted first. Prefix-closed policies (LRU, the oracle, WA with leaf_only) "
                         "have none.")


def _cost_table(results: pl.DataFrame, policies: list[str]) -> Table:
    rows = []
    for pol in policies:
        part = results.filter(pl.col("policy") == pol)
        if not part.height:
            continue
        refs_per_s = _median(part["refs_per_s"])
        qttft_s = _median(part["qttft_mean_s"])  # seconds: queueing makes it minutes when the cache is small
        rows.append([pol, fmt.num(None if refs_per_s is None else refs_per_s / 1e6),
                     fmt.count(_median(part.filter(pl.col("num_evictions") > 0)["evict_decision_ns"])),
                     fmt.count(float(part["num_evictions"].cast(pl.Float64).sum())),
                     fmt.seconds(qttft_s)])
    return Table(columns=["policy", "M refs/s (median over capacities)", "eviction decision (ns, median)",
                          "evictions (all capacities)", "mean QTTFT (median over capacities)"], rows=rows)


def _cost_caption(cost: dict[str, Any] | None) -> str:
    if not cost:
        return ""
    overhead = fmt.milliseconds(1000 * float(cost.get("overhead_s") or 0))
    return (f"cost model {cost.get('name', '')}: prefill = {overhead}"
            f" + {fmt.num(1e6 * float(cost.get('s_per_token') or 0))} us x uncached tokens"
            f" (+ {fmt.num(1e6 * float(cost.get('s_per_loaded_token') or 0))} us x tokens loaded from CPU),"
            f" arrival times x {fmt.num(cost.get('arrival_scale'))}")


def _median(values: pl.Series) -> float | None:
    v = values.drop_nulls().cast(pl.Float64)
    return float(np.median(v.to_numpy())) if v.len() else None
