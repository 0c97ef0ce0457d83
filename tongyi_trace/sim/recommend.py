"""The capacity planner's answer from one simulation sweep: how much cache, which policy, at what latency.

From a sweep's rows (policy x capacity), its exact one-pass LRU curve and its ideal hit ratio:
- per target (80 / 90 / 95% of the ideal hit ratio), the smallest cache at which LRU reaches it (exact,
  from the curve) and the smallest swept capacity at which the best deployable policy does (the sweep's
  grid: "reached at or below"), with the QTTFT there;
- per swept capacity, the best deployable policy (not the oracle, not an ablation variant) and its gain
  over LRU, the fitted policy (rows named `fitted`, else `wa`) flagged when it loses to LRU, and the
  single-instance queue's utilization with the instances that keep it below 1;
- every cache size in GiB and in x HBM (models.ModelPreset.x_hbm: over the HBM left for KV after the
  weights), per model preset (KV bytes per block at the sweep's block size);
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tongyi_trace.errors import KvtraceError
from tongyi_trace.models import GIB, PRESETS, ModelPreset
from tongyi_trace.policy.file import PolicyChoice, load_policy, setting_label
from tongyi_trace.run import PIN_FILE, read_artifact, write_json
from tongyi_trace.schemas import RECOMMENDATION_SCHEMA, SIM_PIN_SCHEMA, SIM_SCHEMA
from tongyi_trace.sim.bootstrap import Interval, significant_best
from tongyi_trace.sim.registry import VARIANTS

TARGETS = (0.80, 0.90, 0.95)
NOT_DEPLOYABLE = frozenset({"oracle", *VARIANTS})  # bounds and ablations, not settings one runs
NOT_DEPLOYABLE_ROUTERS = frozenset({"oracle-affinity"})  # an upper bound, not a router one can run
FITTED_NAMES = ("fitted", "wa")  # the exported policy: `fitted` when simulated, else `wa`


def recommend(rows: Sequence[dict[str, Any]], curve: dict[str, Any], summary: dict[str, Any],
              models: Sequence[ModelPreset] = tuple(PRESETS.values()),
              fleet_rows: Sequence[dict[str, Any]] | None = None,
              choices: Sequence[PolicyChoice] | None = None) -> dict[str, Any]:
    """The recommendation document (schema kvtrace.recommendation/1) of one sweep: sizes for the sweep's own
    model (summary's model_shape: a config.json, --gpu-mem, --tp) first, then MODELS of other names; the
    fleet's configuration from FLEET_ROWS (a fleet sweep's rows), when given. What to run at a capacity is
    the policy file's choice there (CHOICES, default: those of the sweep's policy file, summary's
    params_path) when it has one, with the sweep's gain as evidence; elsewhere the sweep's own answer by
    the same rule (significant_best)."""
    if choices is None:
        choices = sweep_choices(summary)
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
                         "x_hbm": m.x_hbm(blocks * m.kv_bytes_per_block(block_size))} for m in models}

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
        choice = _choice_at(choices, blocks)
        if choice is not None:
            sweep_view = {k: entry[k] for k in ("run_policy", "run_gain_pp", "closest")}
            entry.update(choice_entry(choice))
            entry["sweep"] = {**sweep_view, "fitted_gain_pp": _pm(g) if (g := _interval(f)) else None}
        run = entry.get("run_policy")
        # what runs is `fitted` where the file decides (also when it chose LRU: then fitted = LRU)
        entry["best_other"] = _best_other(here, lru, fitted if entry.get("decided_by") == "fit" else str(run))
        ran = cell.get((fitted, label)) if entry.get("decided_by") == "fit" and run != "lru" and fitted else \
            cell.get((str(run), label))
        entry["run_qttft_mean_s"] = ran.get("qttft_mean_s") if ran else None
        entry["run_utilization"] = ran.get("utilization") if ran else None
        if f is not None and lru is not None:
            vs = 100 * (f["hit_ratio"] - lru["hit_ratio"])
            g = _interval(f)  # with intervals: loses only when significantly worse (the rule fit chooses by)
            entry["fitted"] = {"policy": fitted, "hit_ratio": f["hit_ratio"], "vs_lru_pp": vs,
                               "loses_to_lru": g.hi < 0 if g is not None else vs < 0}
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
                    "gpu_mem_bytes": m.gpu_mem_bytes, "hbm_kv_bytes": m.hbm_kv_bytes,
                    "hbm_definition": m.hbm_definition()} for m in models],
        "fitted_policy": fitted, "policy_file": summary.get("params_path"), "targets": targets,
        "capacities": per_cap,
        "fitted_loses_at": [e["capacity"] for e in per_cap if e["fitted"] and e["fitted"]["loses_to_lru"]],
        "saturated_at": [e["capacity"] for e in per_cap if e["saturated"]],
        "instances_suggested": max((e["instances_needed"] for e in per_cap if e["instances_needed"] is not None),
                                   default=None),
        "fleet": recommend_fleet(fleet_rows) if fleet_rows else None,
    }


def sweep_choices(summary: dict[str, Any]) -> list[PolicyChoice]:
    """The choices of the policy file the sweep used (summary's params_path), [] without one or when it is
    gone or unreadable (the sweep's own answer is then used everywhere)."""
    path = summary.get("params_path")
    if not path or not Path(str(path)).is_file():
        return []
    try:
        return list(load_policy(str(path)).choices)
    except KvtraceError:
        return []


def _choice_at(choices: Sequence[PolicyChoice], capacity_blocks: int) -> PolicyChoice | None:
    """The choice made for CAPACITY_BLOCKS (within 2%: the same capacity resolved on the same trace)."""
    near = [c for c in choices if abs(c.capacity_blocks - capacity_blocks) <= 0.02 * max(capacity_blocks, 1)]
    return min(near, key=lambda c: abs(c.capacity_blocks - capacity_blocks), default=None)


def choice_entry(choice: PolicyChoice) -> dict[str, Any]:
    """The answer at one capacity from a policy file's choice (what `kvtrace fit` chose on the held-out
    part of its train window): run_policy, run_setting, run_gain_pp ({point, lo, hi}, None for LRU or a file
    without intervals), closest (the best other candidate and its gain) and decided_by "fit"."""
    tr = choice.train
    gain, best = tr.get("gain_vs_lru_pp"), tr.get("best_candidate_gain_vs_lru_pp")
    closest = ({"policy": str(tr["best_candidate"]), "gain_pp": _pm_json(best)}
               if isinstance(best, dict) and tr.get("best_candidate") not in (None, "lru") else None)
    point = tr.get("gain_vs_lru")
    return {"run_policy": choice.policy, "run_setting": setting_label(choice.policy, choice.params),
            "run_gain_pp": _pm_json(gain) if isinstance(gain, dict) and choice.policy != "lru" else None,
            "run_gain_point_pp": None if point is None else 100 * float(point),
            "run_qttft_change_pct": None, "closest": closest, "decided_by": "fit",
            "confidence": tr.get("confidence")}


def _pm_json(g: dict[str, Any]) -> dict[str, float]:
    return {"point": float(g["point"]), "lo": float(g["lo"]), "hi": float(g["hi"])}


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
        return {"run_policy": None, "run_setting": None, "run_gain_pp": None, "run_qttft_change_pct": None,
                "closest": None, "decided_by": None}
    run = significant_best(gains) or "lru"
    by = {str(r["policy"]): r for r in here}
    closest = max(gains, key=lambda p: (gains[p].point, p))
    q = _interval(by[run], "qttft_change", "pct") if run != "lru" else None
    return {"run_policy": run, "run_setting": run, "run_gain_pp": _pm(gains[run]) if run != "lru" else None,
            "run_qttft_change_pct": _pm(q) if q else None, "decided_by": "sweep",
            "closest": {"policy": closest, "gain_pp": _pm(gains[closest])}}


def _best_other(here: Sequence[dict[str, Any]], lru: dict[str, Any] | None, running: str | None
                ) -> dict[str, Any] | None:
    """The deployable policy of the sweep, other than LRU and RUNNING, with the highest point gain over LRU
    (with its interval when the sweep has them), None when there is none."""
    others = [r for r in here if r["policy"] not in ("lru", running) and lru is not None]
    if not others or lru is None:
        return None
    r = max(others, key=lambda r: (r["hit_ratio"], r["policy"]))
    g = _interval(r)
    point = 100 * (r["hit_ratio"] - lru["hit_ratio"])
    return {"policy": r["policy"], "gain_pp": _pm(g) if g else {"point": point, "lo": point, "hi": point}}


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

    ok = [r for r in rows if "error" not in r and r.get("hit_ratio") is not None]
    rr = {(r["num_instances"], r["policy"], r["capacity"]): r["hit_ratio"] for r in ok if r["router"] == "rr"}
    runnable = [entry(r) for r in ok if r["policy"] not in NOT_DEPLOYABLE and r["router"] not in NOT_DEPLOYABLE_ROUTERS]
    for e in runnable:
        base = rr.get((e["num_instances"], e["policy"], e["capacity"]))
        e["gain_vs_rr_pp"] = None if base is None else 100 * (e["hit_ratio"] - base)
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


# The pin (run.PIN_FILE) lies beside RUN/sim/, not in it: RUN/sim/ is a committed set each sweep replaces whole.
FIRST_SWEEP = "first"  # RUN/sim/first/: a copy of the first full unnamed sweep, pinned


@dataclass(frozen=True)
class PinnedSweep:
    """The sweep the report reads: its folder, its name (None: RUN/sim/ itself) and why it is the one."""

    path: Path
    name: str | None
    why: str

    def describe(self) -> str:
        """'the sweep 'first' (RUN/sim/first/; pinned: the first full sweep)'."""
        if self.name:
            return f"the sweep {self.name!r} (RUN/sim/{self.name}/; {self.why})"
        return f"the latest sweep (RUN/sim/; {self.why})"


def is_full_sweep(summary: dict[str, Any]) -> bool:
    """A sweep that can answer the planner: LRU and at least one other policy over at least two capacities."""
    pols = [str(p) for p in summary.get("policies") or []]
    return "lru" in pols and len(pols) >= 2 and len(summary.get("capacities") or []) >= 2


def pin_sweep(sim_root: Path, name: str, why: str) -> None:
    """Pin the named sweep SIM_ROOT/NAME/ as the one the report reads (RUN/pinned_sweep.json)."""
    write_json(sim_root.parent / PIN_FILE, {"schema": SIM_PIN_SCHEMA, "name": name, "why": why})


def first_sweep_due(sim_root: Path, name: str | None, summary: dict[str, Any]) -> bool:
    """Whether the sweep being committed is kept as SIM_ROOT/first/ and pinned: an unnamed full sweep when
    nothing is pinned yet (a one-off never replaces the pin)."""
    return not name and pinned_sweep(sim_root) is None and is_full_sweep(summary)


def pin_after_sweep(sim_root: Path, name: str | None, first: bool) -> None:
    """After a sweep was committed: `--name NAME` pins NAME; FIRST (first_sweep_due, its copy committed to
    SIM_ROOT/first/) pins that; any other sweep leaves the pin as it is."""
    if name:
        pin_sweep(sim_root, name, "pinned by --name")
    elif first:
        pin_sweep(sim_root, FIRST_SWEEP, "pinned: the first full sweep")


def pinned_sweep(sim_root: Path) -> PinnedSweep | None:
    """The pinned sweep of SIM_ROOT (RUN/sim/), None when none is pinned or its folder is gone."""
    try:
        doc = read_artifact(sim_root.parent / PIN_FILE, SIM_PIN_SCHEMA, required=False)
    except KvtraceError:
        return None
    name = str((doc or {}).get("name") or "")
    if not name or not (sim_root / name / "summary.json").is_file():
        return None
    return PinnedSweep(sim_root / name, name, str(doc.get("why") or "pinned") if doc else "pinned")


def report_sweep(run_path: Path) -> PinnedSweep | None:
    """The sweep the report and the Recommendation read: the pinned one, else the latest (RUN/sim/), None
    without RUN/sim/."""
    root = Path(run_path) / "sim"
    pin = pinned_sweep(root)
    if pin is not None:
        return pin
    if root.is_dir():  # the latest sweep, also while it runs (results.jsonl before summary.json)
        return PinnedSweep(root, None, "none pinned: the latest sweep")
    return None


def recommend_run(run_path: Path, models: Sequence[ModelPreset] = tuple(PRESETS.values())) -> dict[str, Any] | None:
    """The recommendation of RUN_PATH's report sweep (report_sweep), naming that sweep (`sweep`), with the
    fleet sweep of RUN/sim/fleet/; None without a sweep."""
    sweep = report_sweep(run_path)
    if sweep is None:
        return None
    rec = recommend_sim_dir(sweep.path, models, fleet_dir=Path(run_path) / "sim" / "fleet")
    if rec is not None:
        rec["sweep"] = {"name": sweep.name, "path": str(sweep.path), "why": sweep.why, "text": sweep.describe()}
    return rec


def recommend_sim_dir(sim_dir: Path, models: Sequence[ModelPreset] = tuple(PRESETS.values()),
                      fleet_dir: Path | None = None) -> dict[str, Any] | None:
    """The recommendation from a finished sweep's artifacts in SIM_DIR, with the fleet sweep of FLEET_DIR
    (default SIM_DIR/fleet/) if there is one (None when there is no sweep)."""
    import polars as pl

    paths = [sim_dir / n for n in ("summary.json", "results.parquet", "lru_curve.parquet")]
    if not all(p.is_file() for p in paths):
        return None
    summary = read_artifact(paths[0], SIM_SCHEMA) or {}
    rows = pl.read_parquet(paths[1]).to_dicts()
    curve = pl.read_parquet(paths[2])
    return recommend(rows, {c: curve[c].to_numpy() for c in curve.columns}, summary, models,
                     fleet_rows(fleet_dir if fleet_dir is not None else sim_dir / "fleet"))


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
    return f"{s['gib']:,.1f} GiB = {s['x_hbm']:.2f}x HBM"


def _sec(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:,.2f} s"


def answer_lines(rec: dict[str, Any], model: str) -> list[str]:
    """The answer per simulated capacity in plain words, sizes for MODEL (answer_line)."""
    level = float((rec.get("intervals") or {}).get("confidence") or 0.95)
    return [answer_line(e, f"{e['capacity']} ({e['capacity_blocks']:,} blocks = {_gib(e['size'], model)})", level)
            for e in rec["capacities"]]


def choice_answer(choice: PolicyChoice, model: ModelPreset | None = None, block_size: int = 16) -> str:
    """The answer at one capacity from a policy file's choice (`kvtrace fit`), in the words of the
    Recommendation (answer_line), sizes for MODEL at BLOCK_SIZE-token blocks when given."""
    at = f"{choice.capacity_blocks:,} blocks"
    if model is not None:
        b = choice.capacity_blocks * model.kv_bytes_per_block(block_size)
        at += f" = {b / GIB:,.1f} GiB = {model.x_hbm(b):.2f}x HBM"
    return answer_line(choice_entry(choice), f"{choice.capacity} ({at})")


def answer_line(e: dict[str, Any], at: str, confidence: float = 0.95) -> str:
    """One capacity's answer in plain words, the same sentence in `kvtrace fit`, `kvtrace simulate`, the report
    and the Python API: 'At 1L (...) run the fitted choice (wa model=km ...): +5.70 +- 1.10 points over LRU.'
    or 'At ... run LRU: no policy is significantly better here at 95% (best: s3fifo +0.40 +- 0.60 points).'
    E is an answer entry (choice_entry, or a capacity of `recommend`); AT says where ('0.5L (1,234 blocks)').
    A fit-decided answer carries the sweep's gain after it when the sweep measured one."""
    level = f"{100 * float(e.get('confidence') or confidence):g}%"
    fit = e.get("decided_by") == "fit"
    run = e.get("run_policy")
    if run is None:
        gain = "" if e.get("gain_over_lru_pp") is None else f": {e['gain_over_lru_pp']:+.2f} points over LRU"
        return f"At {at} the best policy is {e.get('best_policy')}{gain} (no intervals: --no-intervals)."
    c = e.get("closest")
    if run == "lru":
        head = f"At {at} run LRU" + (" (the fitted choice)" if fit else "")
        if c is None:
            line = head + "."
        elif c["gain_pp"]["point"] <= 0:
            line = f"{head}: no policy beats it here (best: {c['policy']} {_pm_text(c['gain_pp'])} points)."
        else:
            line = (f"{head}: no policy is significantly better here at {level} (best: {c['policy']} "
                    f"{_pm_text(c['gain_pp'])} points).")
    else:
        name = f"the fitted choice ({e.get('run_setting') or run})" if fit else run
        g = e.get("run_gain_pp")
        if g is None:
            pts = e.get("run_gain_point_pp")
            gain = "." if pts is None else f": {pts:+.2f} points over LRU (no interval in this file)."
        else:
            gain = f": {_pm_text(g)} points over LRU" + (f" (significant at {level})." if fit else ".")
        q = e.get("run_qttft_change_pct")
        line = f"At {at} run {name}{gain}"
        if q is not None:
            line = line[:-1] + f", QTTFT {q['point']:+.1f}% +- {(q['hi'] - q['lo']) / 2:.1f}%."
    return line + _sweep_evidence(e)


def _sweep_evidence(e: dict[str, Any]) -> str:
    """' In this sweep (whole trace): fitted +0.67 +- 0.20 points.' for a fit-decided answer, '' otherwise."""
    sw = e.get("sweep")
    if e.get("decided_by") != "fit" or not sw:
        return ""
    if e["run_policy"] != "lru" and sw.get("fitted_gain_pp"):
        return f" In this sweep: fitted {_pm_text(sw['fitted_gain_pp'])} points."
    c = sw.get("closest")
    if c and c["gain_pp"]["point"] > 0:
        return f" In this sweep: best {c['policy']} {_pm_text(c['gain_pp'])} points."
    return ""


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
    if any(e.get("decided_by") == "fit" for e in rec["capacities"]) or rec.get("fitted_policy") == "fitted":
        lines.append("fitted = the policy file's choice per capacity (deploy this: the kvtrace plugin runs it); "
                     "wa = the paper's WA with the file's parameters at every capacity (a reference).")
    hbm = next((x.get("hbm_definition") for x in rec["models"] if x["name"] == m), None)
    lines.append(f"Ideal hit ratio {rec['ideal_hit_ratio']:.4f}; sizes for {m} ({rec['block_size']}-token blocks; "
                 f"other presets in --json){': ' + hbm if hbm else ''}.")
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
    sat = saturation_line(rec)
    if sat:
        lines.append(sat)
    lines.append(_fleet_line(rec))
    if rec["fitted_loses_at"]:
        lines.append(f"WARNING: the fitted policy ({rec['fitted_policy']}) loses to LRU at "
                     f"{', '.join(rec['fitted_loses_at'])}: run LRU there or re-fit with 'kvtrace fit RUN -c ...'.")
    return lines


def saturation_line(rec: dict[str, Any]) -> str | None:
    """Saturation in words: 'The queue is saturated at 0.125L, 0.25L (utilization 1.18, 1.06 >= 1): one
    instance cannot keep up, so its QTTFT grows with the trace (a mean of 781.9 s there is this signal, not a
    latency); 2 instances keep it below 1.' None when no capacity saturates."""
    sat = [e for e in rec["capacities"] if e["utilization"] is not None and e["saturated"]]
    if not sat:
        return None
    worst = max((e["best_qttft_mean_s"] for e in sat if e["best_qttft_mean_s"] is not None), default=None)
    mean = "" if worst is None else f" (a mean of {_sec(worst)} there is this signal, not a latency)"
    need = max(int(e["instances_needed"] or 1) for e in sat)
    utils = ", ".join(f"{e['utilization']:.2f}" for e in sat)
    return (f"The queue is saturated at {', '.join(e['capacity'] for e in sat)} (utilization {utils} >= 1): one "
            f"instance cannot keep up, so its QTTFT grows with the trace{mean}; {need} instances keep it below 1.")


ANSWER_COLUMNS = ["capacity", "blocks", "LRU hit", "run", "vs LRU (points)", "best other in the sweep",
                  "QTTFT mean", "utilization"]


def answer_cells(rec: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The Recommendation per capacity as table cells (simulate's terminal table and the report's short
    table): capacity, blocks, LRU's hit ratio, what to run and its gain over LRU, the closest other policy,
    the QTTFT of what runs ('saturated' when its queue is) and its queue's utilization."""
    rows = []
    for e in rec["capacities"]:
        run = e.get("run_policy") or e["best_policy"]
        what = f"fitted ({e.get('run_setting') or run})" if e.get("decided_by") == "fit" and run != "lru" else run
        g = e.get("run_gain_pp")
        gain = _pm_text(g) if g else ("-" if e.get("run_policy") is None else "+0 (LRU)" if run == "lru" else "-")
        c = e.get("best_other")
        u = e.get("run_utilization", e.get("utilization"))
        q = e.get("run_qttft_mean_s", e.get("best_qttft_mean_s"))
        saturated = u is not None and u >= 1.0
        rows.append([str(e["capacity"]), f"{e['capacity_blocks']:,}",
                     "-" if e["lru_hit_ratio"] is None else f"{e['lru_hit_ratio']:.4f}", what, gain,
                     "-" if not c else f"{c['policy']} {_pm_text(c['gain_pp'])}",
                     f"saturated ({_sec(q)})" if saturated else _sec(q),
                     "-" if u is None else f"{u:.2f}"])
    return ANSWER_COLUMNS, rows


def _config(e: dict[str, Any]) -> str:
    """'router prefix, 4 instances, lru at 10% per instance: hit 0.5500 (+8.00 points over round-robin), P99
    QTTFT 1.20 s, busiest instance's utilization 0.81'."""
    gain = e.get("gain_vs_rr_pp")
    over = "" if gain is None or e["router"] == "rr" else f" ({gain:+.2f} points over round-robin)"
    return (f"router {e['router']}, {e['num_instances']} instance{'s' if e['num_instances'] != 1 else ''}, "
            f"{e['policy']} at {e['capacity']} per instance: hit {e['hit_ratio']:.4f}{over}, P99 QTTFT "
            f"{_sec(e['qttft_p99_s'])}, busiest instance's utilization {e['max_utilization']:.2f}")


def _fleet_line(rec: dict[str, Any]) -> str:
    """The fleet sentence: the best fleet configuration, or the instances the saturation check suggests."""
    f = rec.get("fleet")
    if f is not None:
        return fleet_sentence(f)
    n = rec.get("instances_suggested")
    if n is None:
        return "Fleet: no fleet sweep and no utilization to size one (the cost model was off)."
    what = ("one instance keeps up at every simulated capacity" if n == 1 else
            f"the saturation check suggests {n} instances (utilization below 1 at every simulated capacity)")
    return (f"Fleet: {what}; no fleet sweep yet: 'kvtrace simulate RUN --instances "
            f"{','.join(str(k) for k in sorted({1, n, 2 * n}))} --router prefix,least-loaded' compares routers.")


def fleet_sentence(f: dict[str, Any]) -> str:
    """The fleet's Recommendation (recommend_fleet's document) in words: the router and instance count to run
    with their hit ratio, gain over round-robin and utilization, and the fewest instances that keep up."""
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
