"""The capacity planner's answer from one simulation sweep: how much cache, which policy, at what latency.

From a sweep's rows (policy x capacity), its exact one-pass LRU curve and its ideal hit ratio:
- per target (80 / 90 / 95% of the ideal hit ratio), the smallest cache at which LRU reaches it (exact,
  from the curve) and the smallest swept capacity at which the best deployable policy does (the sweep's
  grid: "reached at or below"), with the QTTFT there;
- per swept capacity, the best deployable policy (not the oracle, not an ablation variant) and its gain
  over LRU, the fitted policy (rows named `fitted`, else `wa`) flagged when it loses to LRU, and the
  single-instance queue's utilization with the instances that keep it below 1;
- every cache size in GiB and in multiples of one GPU's memory, per model preset (KV bytes per block at
  the sweep's block size).
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
from tongyi_trace.schemas import RECOMMENDATION_SCHEMA

TARGETS = (0.80, 0.90, 0.95)
NOT_DEPLOYABLE = frozenset({"oracle", "wa-no-life", "wa-conditional", "wa-no-offset"})
FITTED_NAMES = ("fitted", "wa")  # the exported policy: `fitted` when simulated, else `wa`


def recommend(rows: Sequence[dict[str, Any]], curve: dict[str, Any], summary: dict[str, Any],
              models: Sequence[ModelPreset] = tuple(PRESETS.values())) -> dict[str, Any]:
    """The recommendation document (schema kvtrace.recommendation/1) of one sweep: sizes for the sweep's own
    model (summary's model_shape: a config.json, --gpu-mem, --tp) first, then MODELS of other names."""
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
        targets.append({
            "target": t, "hit_ratio": t * ideal,
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
        "sweep_model": summary.get("model"),
        "models": [{"name": m.name, "kv_bytes_per_block": m.kv_bytes_per_block(block_size),
                    "gpu_mem_bytes": m.gpu_mem_bytes} for m in models],
        "fitted_policy": fitted, "targets": targets, "capacities": per_cap,
        "fitted_loses_at": [e["capacity"] for e in per_cap if e["fitted"] and e["fitted"]["loses_to_lru"]],
        "saturated_at": [e["capacity"] for e in per_cap if e["saturated"]],
    }


def recommend_sim_dir(sim_dir: Path, models: Sequence[ModelPreset] = tuple(PRESETS.values())) -> dict[str, Any] | None:
    """The recommendation from a finished sweep's artifacts in SIM_DIR (None when there is no sweep)."""
    import polars as pl

    paths = [sim_dir / n for n in ("summary.json", "results.parquet", "lru_curve.parquet")]
    if not all(p.is_file() for p in paths):
        return None
    summary = json.loads(paths[0].read_text())
    rows = pl.read_parquet(paths[1]).to_dicts()
    curve = pl.read_parquet(paths[2])
    return recommend(rows, {c: curve[c].to_numpy() for c in curve.columns}, summary, models)


def _gib(size: dict[str, dict[str, float]] | None, model: str) -> str:
    if not size or model not in size:
        return "-"
    s = size[model]
    return f"{s['gib']:,.1f} GiB ({s['x_gpu_hbm']:.2f}x one GPU's HBM)"


def _sec(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:,.2f} s"


def describe(rec: dict[str, Any], model: str | None = None) -> list[str]:
    """The recommendation as plain sentences (one per line), sizes for MODEL (default: the sweep's model,
    else the first preset)."""
    names = [m["name"] for m in rec["models"]]
    m = str(model if model in names else (rec["sweep_model"] if rec["sweep_model"] in names else names[0]))
    lines = [f"Ideal hit ratio {rec['ideal_hit_ratio']:.4f}; sizes for {m} ({rec['block_size']}-token blocks; "
             "other presets in --json)."]
    for t in rec["targets"]:
        pct = f"{100 * t['target']:.0f}% of ideal ({t['hit_ratio']:.4f})"
        lru = t["lru"]
        lru_txt = ("LRU never reaches it" if lru["capacity_blocks"] is None else
                   f"LRU needs {lru['capacity_blocks']:,} blocks = {_gib(lru['size'], m)}"
                   + (f", QTTFT mean {_sec(lru['qttft_mean_s'])} (at {lru['qttft_at']})" if lru["qttft_at"] else ""))
        b = t["best"]
        best_txt = ("no simulated capacity reaches it" if b is None else
                    f"best {b['policy']} at {b['capacity']} = {b['capacity_blocks']:,} blocks = {_gib(b['size'], m)}, "
                    f"QTTFT mean {_sec(b['qttft_mean_s'])}")
        lines.append(f"{pct}: {lru_txt}; {best_txt}.")
    for e in rec["capacities"]:
        gain = "" if e["gain_over_lru_pp"] is None else f" ({e['gain_over_lru_pp']:+.2f} points over LRU)"
        line = (f"at {e['capacity']} ({_gib(e['size'], m)}): run {e['best_policy']}, hit {e['best_hit_ratio']:.4f}"
                f"{gain}, QTTFT mean {_sec(e['best_qttft_mean_s'])}")
        if e["utilization"] is not None:
            line += f", utilization {e['utilization']:.2f}"
            if e["saturated"]:
                line += (f" >= 1: one instance cannot keep up (QTTFT grows with the trace); "
                         f"{e['instances_needed']} instances keep it below 1")
        lines.append(line + ".")
    if rec["fitted_loses_at"]:
        lines.append(f"WARNING: the fitted policy ({rec['fitted_policy']}) loses to LRU at "
                     f"{', '.join(rec['fitted_loses_at'])}: run LRU there or re-fit with 'kvtrace fit RUN -c ...'.")
    return lines
