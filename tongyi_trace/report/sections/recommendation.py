"""Section (first in the report): the planner's answer from the simulation sweep: the cache (GiB, and x one
GPU's memory) at which LRU and the best policy reach 80/90/95% of the ideal hit ratio, per model preset;
the best policy per capacity with its gain over LRU; QTTFT; a flag when the fitted policy loses to LRU;
the queue's utilization and the instances that keep it below 1; the fleet (router x instances) with the
lowest P99 QTTFT that keeps every instance below utilization 1 when a fleet sweep was run, else the
instances the saturation check suggests (tongyi_trace/sim/recommend.py).
Artifacts: RUN_DIR/sim/summary.json, results.parquet, lru_curve.parquet (docs/artifacts/sim.md), and
RUN_DIR/sim/fleet/results.parquet (or results.jsonl) when there is a fleet sweep (docs/fleet.md)."""

from __future__ import annotations

from typing import Any

from tongyi_trace.report import fmt
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.run import RunDir
from tongyi_trace.sim.recommend import describe, recommend_run


def build(run: RunDir) -> list[Section]:
    """The Recommendation section, or nothing when no finished `kvtrace simulate` sweep is in RUN_DIR/sim/."""
    rec = recommend_run(run.path)
    if rec is None or not rec["capacities"]:
        return []
    iv = rec.get("intervals") or {}
    level = f"{100 * float(iv.get('confidence') or 0.95):g}%"
    how = (f" Intervals ({level}): a paired block bootstrap over {iv.get('num_groups')} {iv.get('resampled')} "
           f"({iv.get('num_resamples')} resamples; tongyi_trace/sim/bootstrap.py); a policy other than LRU is "
           "recommended only when its gain over LRU is significant, the one with the highest lower bound."
           if iv else " No intervals (simulated with --no-intervals): the best policy by its point value.")
    s = Section(key="recommendation", title="Recommendation: how much cache, which policy",
                definition="Targets are shares of the ideal (infinite cache) hit ratio. LRU's sizes are exact (the "
                           "one-pass LRU curve, any capacity); the best policy's are the smallest simulated "
                           "capacity reaching the target (the sweep's grid). Best = highest hit ratio among the "
                           "deployable policies (not the oracle, not the WA ablations), LRU on ties. GiB = blocks x "
                           "the model's KV bytes per block; x HBM = GiB over one GPU's memory. QTTFT and "
                           "utilization: one instance under the cost model of 'kvtrace simulate' (utilization = "
                           "prefill time / arrival span; >= 1 means the queue grows without bound)." + how)
    models = [m["name"] for m in rec["models"]]
    s.tables["targets"] = Table(
        columns=["target (of ideal)", "hit ratio", "model", "LRU needs", "best policy reaches it at", "QTTFT mean "
                 "(LRU / best)"],
        rows=[[fmt.pct(t["target"], 0), fmt.ratio(t["hit_ratio"]), m,
               _size(t["lru"]["size"], m, t["lru"]["capacity_blocks"])
               + _blocks_iv(t.get("lru_capacity_blocks_interval")),
               "not reached in the sweep" if t["best"] is None else f"{t['best']['policy']} at "
               f"{t['best']['capacity']}: {_size(t['best']['size'], m, t['best']['capacity_blocks'])}",
               f"{fmt.seconds(t['lru']['qttft_mean_s'])} / {fmt.seconds((t['best'] or {}).get('qttft_mean_s'))}"]
              for t in rec["targets"] for m in models],
        caption="LRU 'never' = the ideal is not reachable by LRU at any size (pinning); QTTFT of LRU at the next "
                "simulated capacity at or above its size.")
    main = rec["sweep_model"] if rec["sweep_model"] in models else models[0]
    s.tables["capacities"] = Table(
        columns=["capacity", f"size ({main})", "run", f"gain over LRU (points, {level})",
                 f"QTTFT vs LRU (%, {level})", "best policy (point)", "hit ratio", "gain over LRU (points)",
                 "fitted policy vs LRU (points)", "QTTFT mean", "utilization", "instances for < 1"],
        rows=[[e["capacity"], _size(e["size"], main, e["capacity_blocks"]), *_run(e), e["best_policy"],
               fmt.ratio(e["best_hit_ratio"]), _best_gain(e), _fitted(e["fitted"]),
               fmt.seconds(e["best_qttft_mean_s"]), _util(e), fmt.count(e["instances_needed"])]
              for e in rec["capacities"]])
    s.values = {"lines": describe(rec, main), "fitted_loses_at": ", ".join(rec["fitted_loses_at"]),
                "fitted_policy": rec["fitted_policy"], "saturated_at": ", ".join(rec["saturated_at"])}
    t90 = next(t for t in rec["targets"] if t["target"] == 0.90)
    s.headline = [Headline(f"cache for 90% of the ideal hit ratio with LRU ({main})",
                           _size(t90["lru"]["size"], main, t90["lru"]["capacity_blocks"]))]
    best = (rec["fleet"] or {}).get("best")
    if best is not None:
        s.headline.append(Headline("fleet with the lowest P99 QTTFT below utilization 1",
                                   f"{best['router']} x {best['num_instances']} {best['policy']} @ {best['capacity']}: "
                                   f"P99 {fmt.seconds(best['qttft_p99_s'])}, hit {fmt.ratio(best['hit_ratio'])}"))
    elif rec["fleet"] is None and rec["instances_suggested"] is not None:
        s.headline.append(Headline("instances for utilization below 1 (no fleet sweep)",
                                   fmt.count(rec["instances_suggested"])))
    return [s]


def _size(size: dict[str, Any] | None, model: str, blocks: int | None) -> str:
    if blocks is None or not size:
        return "never"
    g = size[model]
    return f"{fmt.count(blocks)} blocks = {g['gib']:,.1f} GiB ({g['x_hbm']:.2f}x HBM)"


def _pp(v: float | None) -> str:
    return fmt.NA if v is None else f"{v:+.2f}"


def _pm(g: dict[str, float] | None, spec: str = ".2f") -> str:
    """'+0.40 +- 0.60' from {point, lo, hi}."""
    if g is None:
        return fmt.NA
    return f"{format(g['point'], '+' + spec)} +- {format((g['hi'] - g['lo']) / 2, spec)}"


def _run(e: dict[str, Any]) -> list[str]:
    """What to run, its gain over LRU and QTTFT change with intervals (LRU: the closest policy's gain)."""
    if e.get("run_policy") is None:
        return [fmt.NA, fmt.NA, fmt.NA]
    if e["run_policy"] == "lru":
        c = e["closest"]
        return ["lru", f"best {c['policy']} {_pm(c['gain_pp'])}: not significant", fmt.NA]
    return [e["run_policy"], _pm(e["run_gain_pp"]), _pm(e.get("run_qttft_change_pct"), ".1f")]


def _best_gain(e: dict[str, Any]) -> str:
    """The best policy's point gain over LRU."""
    return _pp(e["gain_over_lru_pp"])


def _blocks_iv(iv: dict[str, Any] | None) -> str:
    """' (interval 598-695 blocks)' for a size interval, '' without one."""
    if not iv or iv.get("lo") is None:
        return ""
    hi = "never" if iv.get("hi") is None else fmt.count(round(iv["hi"]))
    return f" (interval {fmt.count(round(iv['lo']))}-{hi} blocks)"


def _fitted(f: dict[str, Any] | None) -> str:
    if f is None:
        return fmt.NA
    return f"{f['policy']} {f['vs_lru_pp']:+.2f}" + (" LOSES TO LRU" if f["loses_to_lru"] else "")


def _util(e: dict[str, Any]) -> str:
    u = e["utilization"]
    return fmt.NA if u is None else f"{u:.2f}" + (" (saturated)" if e["saturated"] else "")
