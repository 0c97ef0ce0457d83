"""The capacity planner's answer from one simulation sweep: how much cache, which policy, at what latency.

From a sweep's rows (policy x capacity), its exact one-pass LRU curve and its ideal hit ratio:
- per target (80 / 90 / 95% of the ideal hit ratio), the smallest cache at which LRU reaches it (exact,
  from the curve) and the smallest swept capacity at which the best deployable policy does (the sweep's
  grid: "reached at or below"), with the QTTFT there;
- per swept capacity, the best deployable policy (not the oracle, not an ablation variant) and its gain
  over LRU, the fitted policy (rows named `fitted`, else `wa`) flagged when it loses to LRU, and the
  single-instance queue's utilization with the instances that keep it below 1;
- every cache size in GiB and in multiples of one GPU's memory, per model preset (KV bytes per block at
  the sweep's block size);
- the fleet: with a fleet sweep (`kvtrace simulate --instances --router`, RUN_DIR/sim/fleet/), the router x
  instance count x policy x capacity per instance with the lowest P99 QTTFT among those that keep every
  instance's utilization below 1, and the fewest instances that do; without one, the instances the
  single-instance saturation check suggests.
Used by `kvtrace simulate` (printed first) and by the report's Recommendation section.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tongyi_trace.models import GIB, PRESETS, ModelPreset
from tongyi_trace.run import read_artifact
from tongyi_trace.schemas import RECOMMENDATION_SCHEMA, SIM_SCHEMA
from tongyi_trace.sim.bootstrap import Interval, significant_best
from tongyi_trace.sim.registry import VARIANTS

TARGETS = (0.80, 0.90, 0.95)
NOT_DEPLOYABLE = frozenset({"oracle", *VARIANTS})  # bounds and ablations, not settings one runs
NOT_DEPLOYABLE_ROUTERS = frozenset({"oracle-affinity"})  # an upper bound, not a router one can run
FITTED_NAMES = ("fitted", "wa")  # the exported policy: `fitted` when simulated, else `wa`


def recommend(rows: Sequence[dict[str, Any]], curve: dict[str, Any], summary: dict[str, Any],
              models: Sequence[ModelPreset] = tuple(PRESETS.values()),
              fleet_rows: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The recommendation document (schema kvtrace.recommendation/1) of one sweep: sizes for the sweep's own
    model (summary's model_shape: a config.json, --gpu-mem, --tp) first, then MODELS of other names; the
    fleet's configuration from FLEET_ROWS (a fleet sweep's rows), when given."""
    own = summary.get("model_shape")
    if own:
        mine = ModelPreset(**own)
        models = [mine, *(m for m in models if m.name != mine.name)]
    ideal = float(summary["ideal_hit_ratio"])
    block_size = int(summary["block_size"])
    ok = [r for r in rows if "error" not in r and r.get("hit_ratio") is not None]
    caps = sorted({(int(r["capacity_blocks"]), str(r["capacity"])) for r in ok})
    cell = {(str(r["policy"]), str(r["capacity"])): r for r in ok}
    names = {str(r["policy"]) for r in ok}
    fitted = next((n for n in FITTED_NAMES if n in names), None)

    def size(blocks: int | None) -> dict[str, dict[str, float]] | None:
        if blocks is None:
            return None
        return {m.name: {"gib": blocks * m.kv_bytes_per_block(block_size) / GIB,
                         "x_gpu_hbm": blocks * m.kv_bytes_per_block(block_size) / m.gpu_mem_bytes} for m in models}

    per_cap: list[dict[str, Any]] = []
    for blocks, label in caps:
        here = [r for (p, c), r in cell.items() if c == label and p not in NOT_DEPLOYABLE]
        if not here:
            continue
        best = max(here, key=lambda r: (r["hit_ratio"], r["policy"] == "lru"))
        lru = cell.get(("lru", label))
        entry: dict[str, Any] = {
            "capacity": label, "capacity_blocks": blocks, "size": size(blocks),
            "lru_hit_ratio": lru["hit_ratio"] if lru else None,
            "lru_qttft_mean_s": lru.get("qttft_mean_s") if lru else None,
            "best_policy": best["policy"], "best_hit_ratio": best["hit_ratio"],
            "best_qttft_mean_s": best.get("qttft_mean_s"),
            "gain_over_lru_pp": None if lru is None else 100 * (best["hit_ratio"] - lru["hit_ratio"]),
            "utilization": best.get("utilization"), "saturated": best.get("saturated"),
            "instances_needed": best.get("instances_needed"), "fitted": None,
        }
        entry.update(_answer(here, lru))
        f = cell.get((fitted, label)) if fitted else None
        if f is not None and lru is not None:
            vs = 100 * (f["hit_ratio"] - lru["hit_ratio"])
            entry["fitted"] = {"policy": fitted, "hit_ratio": f["hit_ratio"], "vs_lru_pp": vs, "loses_to_lru": vs < 0}
        per_cap.append(entry)

    curve_caps = np.asarray(curve.get("capacity_blocks", []), np.int64)
    curve_hits = np.asarray(curve.get("hit_ratio", []), np.float64)
    targets = []
    for t in TARGETS:
        need = t * ideal - 1e-12
        at = np.flatnonzero(curve_hits >= need)
        lru_blocks = int(curve_caps[at[0]]) if at.size else None
        lru_row: dict[str, Any] | None = next((cell[("lru", lab)] for b, lab in caps
                        if lru_blocks is not None and b >= lru_blocks and ("lru", lab) in cell), None)
        reach: dict[str, Any] | None = next((e for e in per_cap if e["best_hit_ratio"] >= need), None)
        spread = _target_intervals(summary, t)
        targets.append({
            "target": t, "hit_ratio": t * ideal, "lru_capacity_blocks_interval": spread.get("lru_capacity_blocks"),
            "best_capacity_interval": spread.get("best_capacity"),
            "lru": {"capacity_blocks": lru_blocks, "size": size(lru_blocks),
                    "qttft_mean_s": lru_row.get("qttft_mean_s") if lru_row else None,
                    "qttft_at": lru_row["capacity"] if lru_row else None},
            "best": None if reach is None else {
                "policy": reach["best_policy"], "capacity": reach["capacity"],
                "capacity_blocks": reach["capacity_blocks"], "size": reach["size"],
                "hit_ratio": reach["best_hit_ratio"], "qttft_mean_s": reach["best_qttft_mean_s"]},
        })
    return {
        "schema": RECOMMENDATION_SCHEMA, "ideal_hit_ratio": ideal, "block_size": block_size,
        "intervals": {k: v for k, v in (summary.get("intervals") or {}).items() if k != "targets"} or None,
        "sweep_model": summary.get("model"),
        "models": [{"name": m.name, "kv_bytes_per_block": m.kv_bytes_per_block(block_size),
                    "gpu_mem_bytes": m.gpu_mem_bytes} for m in models],
        "fitted_policy": fitted, "targets": targets, "capacities": per_cap,
        "fitted_loses_at": [e["capacity"] for e in per_cap if e["fitted"] and e["fitted"]["loses_to_lru"]],
        "saturated_at": [e["capacity"] for e in per_cap if e["saturated"]],
        "instances_suggested": max((e["instances_needed"] for e in per_cap if e["instances_needed"] is not None),
                                   default=None),
        "fleet": recommend_fleet(fleet_rows) if fleet_rows else None,
    }


def _interval(row: dict[str, Any] | None, key: str = "gain_vs_lru", unit: str = "pp") -> Interval | None:
    """ROW's KEY_UNIT with its interval (KEY_lo_UNIT, KEY_hi_UNIT), None when the sweep had none."""
    if row is None:
        return None
    vals = [float(v) for part in ("", "_lo", "_hi") if (v := row.get(f"{key}{part}_{unit}")) is not None]
    if len(vals) < 3 or any(math.isnan(v) for v in vals):
        return None
    return Interval(vals[0], vals[1], vals[2], math.nan)


def _answer(here: Sequence[dict[str, Any]], lru: dict[str, Any] | None) -> dict[str, Any]:
    """What to run at one capacity by the rule `kvtrace fit` chooses by (sim.bootstrap.significant_best):
    LRU unless a deployable policy's gain over LRU is significant, then the one with the highest lower
    bound; with its gain and QTTFT change over LRU and their intervals, and the closest other policy.
    All None when the sweep has no intervals (--no-intervals) or no LRU row."""
    gains = {str(r["policy"]): g for r in here if r["policy"] != "lru" and (g := _interval(r)) is not None}
    if lru is None or not gains:
        return {"run_policy": None, "run_gain_pp": None, "run_qttft_change_pct": None, "closest": None}
    run = significant_best(gains) or "lru"
    by = {str(r["policy"]): r for r in here}
    closest = max(gains, key=lambda p: (gains[p].point, p))
    q = _interval(by[run], "qttft_change", "pct") if run != "lru" else None
    return {"run_policy": run, "run_gain_pp": _pm(gains[run]) if run != "lru" else None,
            "run_qttft_change_pct": _pm(q) if q else None,
            "closest": {"policy": closest, "gain_pp": _pm(gains[closest])}}


def _pm(g: Interval) -> dict[str, float]:
    return {"point": g.point, "lo": g.lo, "hi": g.hi}


def _target_intervals(summary: dict[str, Any], target: float) -> dict[str, Any]:
    """The sweep's intervals (summary.json `intervals`) of the sizes reaching TARGET; {} without them."""
    for t in (summary.get("intervals") or {}).get("targets") or []:
        if math.isclose(float(t["target"]), target):
            return dict(t)
    return {}


def max_utilization(row: dict[str, Any]) -> float | None:
    """The busiest instance's utilization of a fleet row (its `utilization` is one value per instance, a list
    or, in results.parquet, that list as JSON); None when unknown."""
    u = row.get("utilization")
    if isinstance(u, str):
        u = json.loads(u)
    if isinstance(u, list):
        u = max(u, default=None)
    return None if u is None or not math.isfinite(u) else float(u)


def recommend_fleet(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The fleet part of the recommendation from a fleet sweep's ROWS: among the deployable configurations
    (not the oracle policy nor a WA ablation, not the oracle-affinity router) whose busiest instance stays
    below utilization 1, `best` has the lowest P99 QTTFT (ties: higher hit ratio, fewer instances) and
    `fewest_instances` the fewest instances (ties: lowest P99 QTTFT); when none stays below 1,
    `least_utilized` is the configuration closest to it."""
    def entry(r: dict[str, Any]) -> dict[str, Any]:
        return {"router": r["router"], "num_instances": int(r["num_instances"]), "policy": r["policy"],
                "capacity": r["capacity"], "capacity_blocks": int(r["capacity_blocks"]), "hit_ratio": r["hit_ratio"],
                "qttft_mean_s": r.get("qttft_mean_s"), "qttft_p99_s": r.get("qttft_p99_s"),
                "max_utilization": max_utilization(r)}

    runnable = [entry(r) for r in rows if "error" not in r and r.get("hit_ratio") is not None
                and r["policy"] not in NOT_DEPLOYABLE and r["router"] not in NOT_DEPLOYABLE_ROUTERS]
    known = [e for e in runnable if e["max_utilization"] is not None]
    keeps_up = [e for e in known if e["max_utilization"] < 1.0]

    def p99(e: dict[str, Any]) -> float:
        return math.inf if e["qttft_p99_s"] is None else float(e["qttft_p99_s"])

    return {
        "num_configurations": len(runnable),
        "best": min(keeps_up, key=lambda e: (p99(e), -e["hit_ratio"], e["num_instances"]), default=None),
        "fewest_instances": min(keeps_up, key=lambda e: (e["num_instances"], p99(e), -e["hit_ratio"]), default=None),
        "least_utilized": None if keeps_up else min(known, key=lambda e: e["max_utilization"], default=None),
        "max_instances": max((e["num_instances"] for e in runnable), default=None),
    }


def recommend_sim_dir(sim_dir: Path, models: Sequence[ModelPreset] = tuple(PRESETS.values())) -> dict[str, Any] | None:
    """The recommendation from a finished sweep's artifacts in SIM_DIR, with the fleet sweep of SIM_DIR/fleet/
    if there is one (None when there is no sweep)."""
    import polars as pl

    paths = [sim_dir / n for n in ("summary.json", "results.parquet", "lru_curve.parquet")]
    if not all(p.is_file() for p in paths):
        return None
    summary = read_artifact(paths[0], SIM_SCHEMA) or {}
    rows = pl.read_parquet(paths[1]).to_dicts()
    curve = pl.read_parquet(paths[2])
    return recommend(rows, {c: curve[c].to_numpy() for c in curve.columns}, summary, models,
                     fleet_rows(sim_dir / "fleet"))


def fleet_rows(fleet_dir: Path) -> list[dict[str, Any]] | None:
    """The rows of the fleet sweep in FLEET_DIR (RUN_DIR/sim/fleet/): results.parquet, or the rows results.jsonl
    holds while the sweep runs; None when there is no fleet sweep."""
    import polars as pl

    if (fleet_dir / "results.parquet").is_file():
        return pl.read_parquet(fleet_dir / "results.parquet").to_dicts()
    if (fleet_dir / "results.jsonl").is_file():
        lines = (fleet_dir / "results.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()] or None
    return None


def _gib(size: dict[str, dict[str, float]] | None, model: str) -> str:
    if not size or model not in size:
        return "-"
    s = size[model]
    return f"{s['gib']:,.1f} GiB ({s['x_gpu_hbm']:.2f}x one GPU's HBM)"


def _sec(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:,.2f} s"


def answer_lines(rec: dict[str, Any], model: str) -> list[str]:
    """The answer per simulated capacity in plain words, sizes for MODEL: 'At 1L (13.0 GiB, ...) run s3fifo:
    +5.70 +- 1.10 points over LRU, QTTFT -41% +- 6%.' or 'At ... run LRU: no policy is significantly better
    here (best: s3fifo +0.40 +- 0.60 points).' Without intervals (--no-intervals): the best policy by its
    point gain, said to be without intervals."""
    iv = rec.get("intervals") or {}
    level = f"{100 * float(iv.get('confidence') or 0.95):g}%"
    lines = []
    for e in rec["capacities"]:
        at = f"At {e['capacity']} = {_gib(e['size'], model)}"
        if e.get("run_policy") is None:
            gain = "" if e["gain_over_lru_pp"] is None else f": {e['gain_over_lru_pp']:+.2f} points over LRU"
            lines.append(f"{at} the best policy is {e['best_policy']}{gain} (no intervals: --no-intervals).")
        elif e["run_policy"] == "lru" and e["closest"]["gain_pp"]["point"] <= 0:
            c = e["closest"]
            lines.append(f"{at} run LRU: no policy beats it here (best: {c['policy']} {_pm_text(c['gain_pp'])} "
                         "points).")
        elif e["run_policy"] == "lru":
            c = e["closest"]
            lines.append(f"{at} run LRU: no policy is significantly better here at {level} (best: {c['policy']} "
                         f"{_pm_text(c['gain_pp'])} points).")
        else:
            q = e.get("run_qttft_change_pct")
            qt = "" if q is None else f", QTTFT {q['point']:+.1f}% +- {(q['hi'] - q['lo']) / 2:.1f}%"
            lines.append(f"{at} run {e['run_policy']}: {_pm_text(e['run_gain_pp'])} points over LRU{qt}.")
    return lines


def _pm_text(g: dict[str, float], spec: str = "+.2f") -> str:
    """'+0.40 +- 0.60' from {point, lo, hi}."""
    return Interval(g["point"], g["lo"], g["hi"], math.nan).text(spec)


def _blocks_range(iv: dict[str, Any] | None) -> str:
    """' (95%: 598-695 blocks)' from a size interval's JSON, '' without one."""
    if not iv or iv.get("lo") is None:
        return ""
    hi = "never" if iv.get("hi") is None else f"{iv['hi']:,.0f}"
    return f" (interval {iv['lo']:,.0f}-{hi} blocks)"


def describe(rec: dict[str, Any], model: str | None = None) -> list[str]:
    """The recommendation as plain sentences (one per line), the answer per capacity first, sizes for MODEL
    (default: the sweep's model, else the first preset)."""
    names = [m["name"] for m in rec["models"]]
    m = str(model if model in names else (rec["sweep_model"] if rec["sweep_model"] in names else names[0]))
    lines = answer_lines(rec, m)
    lines.append(f"Ideal hit ratio {rec['ideal_hit_ratio']:.4f}; sizes for {m} ({rec['block_size']}-token blocks; "
                 "other presets in --json).")
    for t in rec["targets"]:
        pct = f"{100 * t['target']:.0f}% of ideal ({t['hit_ratio']:.4f})"
        lru = t["lru"]
        lru_txt = ("LRU never reaches it" if lru["capacity_blocks"] is None else
                   f"LRU needs {lru['capacity_blocks']:,} blocks{_blocks_range(t.get('lru_capacity_blocks_interval'))}"
                   f" = {_gib(lru['size'], m)}"
                   + (f", QTTFT mean {_sec(lru['qttft_mean_s'])} (at {lru['qttft_at']})" if lru["qttft_at"] else ""))
        b = t["best"]
        spread = t.get("best_capacity_interval") or {}
        rng = ("" if not spread or spread.get("lo") == spread.get("hi") == (b or {}).get("capacity") else
               f" (interval {spread.get('lo') or 'none'} to {spread.get('hi') or 'none of the simulated'})")
        best_txt = ("no simulated capacity reaches it" if b is None else
                    f"the smallest simulated capacity reaching it: {b['capacity']}{rng} = {b['capacity_blocks']:,} "
                    f"blocks = {_gib(b['size'], m)} with {b['policy']}, QTTFT mean {_sec(b['qttft_mean_s'])}")
        lines.append(f"{pct}: {lru_txt}; {best_txt}.")
    for e in rec["capacities"]:
        if e["utilization"] is not None and e["saturated"]:
            lines.append(f"at {e['capacity']}: utilization {e['utilization']:.2f} >= 1: one instance cannot keep up "
                         f"(QTTFT grows with the trace); {e['instances_needed']} instances keep it below 1.")
    lines.append(_fleet_line(rec))
    if rec["fitted_loses_at"]:
        lines.append(f"WARNING: the fitted policy ({rec['fitted_policy']}) loses to LRU at "
                     f"{', '.join(rec['fitted_loses_at'])}: run LRU there or re-fit with 'kvtrace fit RUN -c ...'.")
    return lines


def _config(e: dict[str, Any]) -> str:
    """'router prefix, 4 instances, lru at 10% per instance: hit 0.5500, P99 QTTFT 1.20 s, utilization 0.81'."""
    return (f"router {e['router']}, {e['num_instances']} instance{'s' if e['num_instances'] != 1 else ''}, "
            f"{e['policy']} at {e['capacity']} per instance: hit {e['hit_ratio']:.4f}, P99 QTTFT "
            f"{_sec(e['qttft_p99_s'])}, utilization {e['max_utilization']:.2f}")


def _fleet_line(rec: dict[str, Any]) -> str:
    """The fleet sentence: the best fleet configuration, or the instances the saturation check suggests."""
    f = rec.get("fleet")
    if f is None:
        n = rec.get("instances_suggested")
        if n is None:
            return "Fleet: no fleet sweep and no utilization to size one (the cost model was off)."
        what = ("one instance keeps up at every simulated capacity" if n == 1 else
                f"the saturation check suggests {n} instances (utilization below 1 at every simulated capacity)")
        return (f"Fleet: {what}; no fleet sweep yet: 'kvtrace simulate RUN --instances "
                f"{','.join(str(k) for k in sorted({1, n, 2 * n}))} --router prefix,least-loaded' compares routers.")
    if f["best"] is None:
        low = f["least_utilized"]
        closest = "" if low is None else f"; the least loaded: {_config(low)}"
        return (f"Fleet: none of the {f['num_configurations']} fleet configurations keeps utilization below 1"
                f"{closest}; simulate more than {f['max_instances']} instances.")
    line = f"Fleet: best configuration that keeps utilization below 1: {_config(f['best'])}"
    fewest = f["fewest_instances"]
    if fewest is not None and fewest["num_instances"] < f["best"]["num_instances"]:
        line += f"; fewest instances: {_config(fewest)}"
    return line + "."
