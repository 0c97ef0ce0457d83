"""`kvtrace simulate`'s core: every policy x capacity over one run, in parallel, written incrementally.

Artifacts in RUN_DIR/sim/ (see docs/artifacts/sim.md):
    results.jsonl       one line per finished (policy, capacity), appended as they finish
    results.parquet     the same rows, flat, written at the end
    per_category.parquet  hit ratios per (policy, capacity, category)
    lru_curve.parquet   the exact one-pass LRU curve (every capacity where it rises)
    summary.json        the configuration, ideal hit ratio, peak live set, cost model
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tongyi_trace.errors import UsageError
from tongyi_trace.fit.params import PolicyParams, load_policy
from tongyi_trace.models import ModelPreset
from tongyi_trace.run import RunDir, write_json
from tongyi_trace.sim.capacity import Capacity, parse_capacities, peak_live_blocks
from tongyi_trace.sim.cost_model import CostModel, qttft_s, summarize_qttft
from tongyi_trace.sim.lru_curve import lru_curve
from tongyi_trace.sim.registry import Policy, get_policy
from tongyi_trace.sim.simulate import simulate_policy
from tongyi_trace.sim.stream import Stream, load_stream, next_request_of_refs, regroup

# WA ablation variants: name -> parameter overrides of wa
WA_VARIANTS: dict[str, dict[str, bool]] = {
    "wa-no-life": {"use_life": False},
    "wa-conditional": {"conditional": True},
    "wa-no-offset": {"use_offset": False},
}


@dataclass(frozen=True)
class SweepConfig:
    """What to simulate."""

    policies: list[str]  # policy names or WA variants (wa-no-life, wa-conditional, wa-no-offset)
    capacities: str  # as the user wrote them (capacity.py)
    model: ModelPreset | None = None
    policy_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # per base policy
    params_path: Path | None = None  # kvtrace.policy/1 file (WA)
    engine_block_size: int | None = None
    hbm_capacity: str | None = None  # splits the cache: this much is HBM, the rest a CPU tier
    cost: CostModel | None = None
    jobs: int = 0  # 0 = one per core
    write: bool = True


@dataclass
class SweepResult:
    """Rows (one per policy x capacity), the LRU curve steps and the run-level figures."""

    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    curve: dict[str, np.ndarray]


def policy_variant(name: str) -> tuple[str, dict[str, Any]]:
    """'wa-no-life' -> ('wa', {'use_life': False}); a plain policy -> (name, {})."""
    low = name.lower()
    if low in WA_VARIANTS:
        return "wa", dict(WA_VARIANTS[low])
    return get_policy(low).name, {}


def prepare_stream(run: RunDir, engine_block_size: int | None) -> Stream:
    """The run's stream, regrouped to ENGINE_BLOCK_SIZE when given."""
    stream = load_stream(run)
    return regroup(stream, engine_block_size) if engine_block_size else stream


def run_sweep(run: RunDir, cfg: SweepConfig,
              on_result: Callable[[dict[str, Any], int, int], None] | None = None) -> SweepResult:
    """Simulate every policy x capacity of CFG over RUN; call ON_RESULT(row, done, total) as each ends."""
    variants = [policy_variant(p) for p in cfg.policies]
    fit: PolicyParams | None = load_policy(cfg.params_path) if cfg.params_path else None
    if fit is None and any(base == "wa" for base, _ in variants):
        raise UsageError("policy wa needs fitted parameters: pass --params policy.json (from 'kvtrace fit')")
    for base, _ in variants:  # validate parameters before any work
        get_policy(base).make_params({**cfg.policy_params.get(base, {})})
    stream = prepare_stream(run, cfg.engine_block_size)
    if stream.num_refs == 0:
        raise UsageError(f"{run.path}: no block references to simulate")
    next_req = next_request_of_refs(stream.req_off, stream.blk, stream.num_ids)
    peak_live = int(peak_live_blocks(stream.req_off, next_req))
    caps = parse_capacities(cfg.capacities, num_distinct=stream.num_ids, block_size_tokens=stream.block_size,
                            model=cfg.model, peak_live=peak_live)
    hbm = None
    if cfg.hbm_capacity:
        hbm = parse_capacities(cfg.hbm_capacity, num_distinct=stream.num_ids,
                               block_size_tokens=stream.block_size, model=cfg.model, peak_live=peak_live)[0]
    curve = lru_curve(stream)
    out_dir = run.subdir("sim") if cfg.write else None
    jsonl = out_dir / "results.jsonl" if out_dir else None
    if jsonl:
        jsonl.write_text("")
    tasks = [(name, base, {**cfg.policy_params.get(base, {}), **over}, cap)
             for name, (base, over) in zip(cfg.policies, variants, strict=True) for cap in caps]
    rows: list[dict[str, Any]] = []

    def done(row: dict[str, Any]) -> None:
        rows.append(row)
        if jsonl:
            with jsonl.open("a") as f:
                f.write(json.dumps(row, default=_jsonable) + "\n")
        if on_result:
            on_result(row, len(rows), len(tasks))

    jobs = cfg.jobs or os.cpu_count() or 1
    t0 = time.perf_counter()
    if jobs > 1 and len(tasks) > 1:
        with tempfile.TemporaryDirectory(prefix="kvtrace-sim-") as tmp:
            path = Path(tmp) / "stream.npz"
            _save_stream(path, stream, next_req)
            ctx = get_context("spawn")
            with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=ctx,
                                     initializer=_worker_init, initargs=(str(path), fit)) as pool:
                futs = [pool.submit(_worker_task, t, hbm, cfg.cost) for t in _by_cost(tasks)]
                for fut in as_completed(futs):
                    done(fut.result())
    else:
        _WORKER.update(stream=stream, next_req=next_req, fit=fit)
        try:
            for t in tasks:
                done(_worker_task(t, hbm, cfg.cost))
        finally:
            _WORKER.clear()
    order = {(n, c.label): i for i, (n, _, _, c) in enumerate(tasks)}
    rows.sort(key=lambda r: order[(r["policy"], r["capacity"])])
    summary = {
        "schema": "kvtrace.sim/1", "num_requests": stream.num_requests, "num_refs": stream.num_refs,
        "num_distinct_blocks": stream.num_ids, "block_size": stream.block_size,
        "engine_block_size": cfg.engine_block_size, "ideal_hit_ratio": stream.ideal_hits() / stream.num_refs,
        "peak_live_blocks": peak_live, "capacities": [asdict(c) for c in caps],
        "hbm_capacity": asdict(hbm) if hbm else None, "model": cfg.model.name if cfg.model else None,
        "cost_model": asdict(cfg.cost) if cfg.cost else None, "params_path": cfg.params_path,
        "policies": cfg.policies, "lru_curve_elapsed_s": curve.elapsed_s,
        "elapsed_s": time.perf_counter() - t0,
    }
    steps = curve.steps()
    if out_dir:
        _write_artifacts(out_dir, rows, summary, steps)
    return SweepResult(rows, summary, steps)


def _by_cost(tasks: list[Any]) -> list[Any]:
    """Largest capacities and slow policies first, so the pool ends evenly."""
    slow = {"oracle": 3, "gdsf": 2, "lfu": 2, "s3fifo": 1}
    return sorted(tasks, key=lambda t: (-slow.get(t[1], 0), -t[3].num_blocks))


_WORKER: dict[str, Any] = {}


def _save_stream(path: Path, s: Stream, next_req: np.ndarray) -> None:
    np.savez(path, req_off=s.req_off, blk=s.blk, ntok=s.ntok, req_cat=s.req_cat, req_time_s=s.req_time_s,
             req_tokens=s.req_tokens, req_idx=s.req_idx, next_req=next_req,
             meta=np.array(json.dumps({"categories": list(s.categories), "num_ids": s.num_ids,
                                       "block_size": s.block_size})))


def _worker_init(path: str, fit: PolicyParams | None) -> None:
    z = np.load(path)
    meta = json.loads(str(z["meta"]))
    stream = Stream(z["req_off"], z["blk"], z["ntok"], z["req_cat"], z["req_time_s"], z["req_tokens"],
                    tuple(meta["categories"]), int(meta["num_ids"]), int(meta["block_size"]), z["req_idx"])
    _WORKER.update(stream=stream, next_req=z["next_req"], fit=fit)


def _worker_task(task: tuple[str, str, dict[str, Any], Capacity], hbm: Capacity | None,
                 cost: CostModel | None) -> dict[str, Any]:
    name, base, params, cap = task
    stream: Stream = _WORKER["stream"]
    nxt = _WORKER["next_req"] if base == Policy.ORACLE.value else None
    res = simulate_policy(stream, base, cap.num_blocks, params=params, fit=_WORKER["fit"], next_req=nxt)
    row = res.summary()
    row.update(policy=name, base_policy=base, capacity=cap.label, refs_per_s=res.refs_per_s)
    if cost is not None:
        loaded = None
        if hbm is not None and hbm.num_blocks < cap.num_blocks:
            small = simulate_policy(stream, base, hbm.num_blocks, params=params, fit=_WORKER["fit"],
                                    next_req=nxt, timing=False)
            loaded = np.maximum(res.req_hit_tokens - small.req_hit_tokens, 0)
            row["hbm_hit_ratio"] = small.hit_ratio
        q = qttft_s(cost, stream.req_time_s, stream.req_tokens - res.req_hit_tokens, loaded)
        row.update(summarize_qttft(q))
    return row


def _jsonable(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(type(o).__name__)


def _write_artifacts(out: Path, rows: list[dict[str, Any]], summary: dict[str, Any],
                     steps: dict[str, np.ndarray]) -> None:
    flat = [{k: (json.dumps(v) if k == "params" else v) for k, v in r.items() if k != "per_category"}
            for r in rows]
    pl.DataFrame(flat).write_parquet(out / "results.parquet")
    cats = [{"policy": r["policy"], "capacity": r["capacity"], "capacity_blocks": r["capacity_blocks"],
             "category": c, **v} for r in rows for c, v in r["per_category"].items()]
    pl.DataFrame(cats).write_parquet(out / "per_category.parquet")
    pl.DataFrame(steps).write_parquet(out / "lru_curve.parquet")
    write_json(out / "summary.json", summary)


@dataclass(frozen=True)
class SimulateOptions:
    """`kvtrace simulate`'s options as given on the command line."""

    policies: str = "lru,fifo,lfu,s3fifo,gdsf,oracle"
    capacities: str = "1%,5%,10%,25%,50%,inf"
    params_path: Path | None = None
    engine_block_size: int | None = None
    model: str = "qwen2-7b"
    hbm_capacity: str | None = None
    cost_model: str | None = None  # preset name; default = model
    overhead_s: float | None = None
    s_per_token: float | None = None
    s_per_loaded_token: float | None = None
    arrival_scale: float | None = None
    cost_from: Path | None = None
    wa_no_life: bool = False
    wa_conditional: bool = False
    wa_no_offset: bool = False
    ablation: bool = False
    sets: tuple[str, ...] = ()  # POLICY.KEY=VALUE
    jobs: int = 0


def parse_sets(sets: tuple[str, ...] | list[str]) -> dict[str, dict[str, str]]:
    """['s3fifo.small_ratio=0.2'] -> {'s3fifo': {'small_ratio': '0.2'}} (policy names checked)."""
    out: dict[str, dict[str, str]] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        pol, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise UsageError(f"--set {item!r}: write POLICY.PARAMETER=VALUE, e.g. s3fifo.small_ratio=0.2")
        out.setdefault(get_policy(pol).name, {})[name] = value
    return out


def build_config(opts: SimulateOptions) -> SweepConfig:
    """Resolve OPTS (policy list, parameters, model preset, cost model) into a SweepConfig."""
    from tongyi_trace.models import get_preset
    from tongyi_trace.sim.cost_model import calibrate_from_replay, override, preset_cost
    from tongyi_trace.sim.registry import parse_policies

    names = [p.value for p in parse_policies(opts.policies)] if opts.policies.strip() else []
    if opts.ablation:
        if "wa" not in names:
            names.append("wa")
        names += [v for v in WA_VARIANTS if v not in names]
    params: dict[str, dict[str, Any]] = {k: dict(v) for k, v in parse_sets(opts.sets).items()}
    wa = params.setdefault("wa", {})
    if opts.wa_no_life:
        wa["use_life"] = False
    if opts.wa_conditional:
        wa["conditional"] = True
    if opts.wa_no_offset:
        wa["use_offset"] = False
    model = get_preset(opts.model)
    cost = override(preset_cost(opts.cost_model or opts.model), overhead_s=opts.overhead_s,
                    s_per_token=opts.s_per_token, s_per_loaded_token=opts.s_per_loaded_token,
                    arrival_scale=opts.arrival_scale)
    if opts.cost_from is not None:
        cost = calibrate_from_replay(opts.cost_from, cost)
    return SweepConfig(policies=names, capacities=opts.capacities, model=model, policy_params=params,
                       params_path=opts.params_path, engine_block_size=opts.engine_block_size,
                       hbm_capacity=opts.hbm_capacity, cost=cost, jobs=opts.jobs)


def simulate_run(run_dir: Path, opts: SimulateOptions,
                 on_result: Callable[[dict[str, Any], int, int], None] | None = None) -> SweepResult:
    """`kvtrace simulate`: open RUN_DIR, resolve OPTS, run the sweep, write RUN_DIR/sim/."""
    from tongyi_trace.run import open_run

    run = open_run(run_dir)
    return run_sweep(run, build_config(opts), on_result)


def describe_policies() -> list[dict[str, Any]]:
    """Every policy with its summary and typed parameters (for --list-policies)."""
    from tongyi_trace.sim.registry import REGISTRY

    out = [{"policy": p.value, "summary": s.summary, "needs_params_file": s.needs_fit,
            "parameters": s.describe()} for p, s in REGISTRY.items()]
    out += [{"policy": v, "summary": f"WA ablation: wa with {over}", "needs_params_file": True,
             "parameters": []} for v, over in WA_VARIANTS.items()]
    return out
