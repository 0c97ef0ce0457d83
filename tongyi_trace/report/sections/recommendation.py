"""Section (first in the report): the planner's answer from the pinned simulation sweep: the cache (GiB, and
x HBM) at which LRU and the best policy reach 80/90/95% of the ideal hit ratio, per model preset;
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
from tongyi_trace.sim.recommend import answer_cells, describe, recommend_run


def build(run: RunDir) -> list[Section]:
    """The Recommendation section, or nothing when the run has no finished `kvtrace simulate` sweep."""
    rec = recommend_run(run.path)
    if rec is None or not rec["capacities"]:
        return []
    iv = rec.get("intervals") or {}
    level = f"{100 * float(iv.get('confidence') or 0.95):g}%"
    how = (f" Intervals ({level}): a paired block bootstrap over {iv.get('num_groups')} {iv.get('resampled')} "
           f"({iv.get('num_resamples')} resamples; tongyi_trace/sim/bootstrap.py); a policy other than LRU is "
           "recommended only when its gain over LRU is significant, the one with the highest lower bound."
           if iv else " No intervals (simulated with --no-intervals): the best policy by its point value.")
    sweep = rec["sweep"]["text"]
    s = Section(key="recommendation", title="Recommendation: how much cache, which policy",
                definition=f"From {sweep}. What to run at a capacity is the policy file's choice there (kvtrace fit "
                           "chose it on the held-out end of its train window) where the file has one, else the "
                           "sweep's own answer by the same rule. Targets are shares of the ideal (infinite cache) "
                           "hit ratio. LRU's sizes are exact (the one-pass LRU curve, any capacity); the best "
                           "policy's are the smallest simulated capacity reaching the target (the sweep's grid). "
                           "GiB = blocks x the model's KV bytes per block; x HBM = over the HBM left for KV after "
                           "the weights (stated in the answer). QTTFT and utilization: one instance under the cost "
                           "model of 'kvtrace simulate' (utilization = prefill time / arrival span; >= 1 means the "
                           "queue grows without bound)." + how)
    models = [m["name"] for m in rec["models"]]
    main = rec["sweep_model"] if rec["sweep_model"] in models else models[0]
    columns, rows = answer_cells(rec)
    s.tables["capacities"] = Table(columns=columns, rows=rows, caption=f"Gains in points of hit ratio with their "
                                   f"{level} interval (+- half its width); the full sweep is in the simulator "
                                   "section below.")
    s.tables["targets"] = Table(
        columns=["target (of ideal)", "hit ratio", "LRU needs", "best policy reaches it at",
                 "QTTFT mean (LRU / best)"],
        rows=[[fmt.pct(t["target"], 0), fmt.ratio(t["hit_ratio"]),
               _size(t["lru"]["size"], main, t["lru"]["capacity_blocks"])
               + _blocks_iv(t.get("lru_capacity_blocks_interval")),
               "not reached in the sweep" if t["best"] is None else f"{t['best']['policy']} at "
               f"{t['best']['capacity']}: {_size(t['best']['size'], main, t['best']['capacity_blocks'])}",
               f"{fmt.seconds(t['lru']['qttft_mean_s'])} / {fmt.seconds((t['best'] or {}).get('qttft_mean_s'))}"]
              for t in rec["targets"]],
        caption=f"Sizes for {main}; the other presets in 'kvtrace simulate --json'. LRU 'never' = the ideal is not "
                "reachable by LRU at any size (pinning); QTTFT of LRU at the next simulated capacity at or above "
                "its size.")
    lines = describe(rec, main)
    s.values = {"answers": [x for x in lines if x.startswith("At ")],
                "notes": [x for x in lines if not x.startswith("At ")], "lines": lines, "sweep": sweep,
                "fitted_loses_at": ", ".join(rec["fitted_loses_at"]), "fitted_policy": rec["fitted_policy"],
                "model": main, "saturated_at": ", ".join(rec["saturated_at"])}
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


def _blocks_iv(iv: dict[str, Any] | None) -> str:
    """' (interval 598-695 blocks)' for a size interval, '' without one."""
    if not iv or iv.get("lo") is None:
        return ""
    hi = "never" if iv.get("hi") is None else fmt.count(round(iv["hi"]))
    return f" (interval {fmt.count(round(iv['lo']))}-{hi} blocks)"


