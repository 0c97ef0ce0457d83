"""`kvtrace simulate`'s core: every policy x capacity over one run, in parallel; the set is written into a
staging folder as rows finish and committed as one step at the end (tongyi_trace/artifact_set.py).

Artifacts in RUN_DIR/sim/ (see docs/artifacts/sim.md):
    results.jsonl       one line per finished (policy, capacity), appended as they finish
    results.parquet     the same rows, flat, written at the end
    per_category.parquet  hit ratios per (policy, capacity, category)
    lru_curve.parquet   the exact one-pass LRU curve (every capacity where it rises)
    summary.json        the configuration, ideal hit ratio, peak live set, cost model
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tongyi_trace.artifact_set import commit_sets, copy_staged, staging_dir
from tongyi_trace.atomic import json_default
from tongyi_trace.errors import UsageError
from tongyi_trace.executor import ExecutorOptions, TaskOutcome, map_tasks
from tongyi_trace.models import DEFAULT_MODEL, ModelPreset, Sizing, remember_sizing, run_sizing
from tongyi_trace.policy.file import PolicyParams, load_policy
from tongyi_trace.run import RunDir, RunTables, atomic_write_text, write_json, write_parquet_atomic
from tongyi_trace.schemas import SIM_SCHEMA
from tongyi_trace.sim.bootstrap import DEFAULT_CONFIDENCE, check_confidence
from tongyi_trace.sim.capacity import Capacity, parse_capacities, peak_live_blocks
from tongyi_trace.sim.cost_model import CostModel, qttft_s, queue_summary
from tongyi_trace.sim.guarded import pop_guard_tables, simulate_guarded, write_guard_tables
from tongyi_trace.sim.intervals import HITS, QTTFT, sweep_intervals
from tongyi_trace.sim.lru_curve import lru_curve
from tongyi_trace.sim.recommend import FIRST_SWEEP, first_sweep_due, pin_after_sweep
from tongyi_trace.sim.registry import (
    BASELINES,
    DEFAULT_CAPACITIES,
    DEFAULT_POLICIES,
    VARIANTS,
    WA_ABLATION,
    Policy,
    get_policy,
)
from tongyi_trace.sim.shared_stream import share_streams, worker_stream
from tongyi_trace.sim.simulate import FITTED, resolve_fitted, simulate_tiered
from tongyi_trace.sim.stream import Stream, load_stream, next_request_of_refs, regroup


@dataclass(frozen=True)
class SweepConfig:
    """What to simulate."""

    policies: list[str]  # policy names or WA variants (wa-no-life, wa-conditional, wa-no-offset, wa-no-guard)
    capacities: str  # as the user wrote them (capacity.py)
    model: ModelPreset | None = None
    policy_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # per base policy
    params_path: Path | None = None  # kvtrace.policy/1 file (WA)
    engine_block_size: int | None = None
    hbm_capacity: str | None = None  # splits the cache: this much is HBM, the rest a CPU tier
    hbm_policy: str | None = None  # the HBM tier's policy (a baseline; default: each row's policy)
    cost: CostModel | None = None
    jobs: int = 0  # 0 = one per core
    write: bool = True
    executor: str = "local"  # local | ray (tongyi_trace/executor.py)
    ray_address: str | None = None  # default $RAY_ADDRESS, else a local Ray instance
    name: str | None = None  # RUN/sim/NAME/, then copied to RUN/sim/ (the latest, which the report reads)
    intervals: bool = True  # the bootstrap intervals of every gain, QTTFT change and target size (sim/intervals.py)
    confidence: float = DEFAULT_CONFIDENCE
    sizing: Sizing | None = None  # the model and GPU settings, remembered in RUN/sizing.json once committed


@dataclass
class SweepResult:
    """Rows (one per policy x capacity), the LRU curve steps and the run-level figures."""

    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    curve: dict[str, np.ndarray]


def policy_variant(name: str) -> tuple[str, dict[str, Any]]:
    """'wa-no-life' -> ('wa', {'use_life': False}); 'fitted' -> ('fitted', {}); a policy -> (name, {})."""
    low = name.lower()
    if low in VARIANTS:
        base, over = VARIANTS[low]
        return base.value, dict(over)
    if low == FITTED:
        return FITTED, {}
    return get_policy(low).name, {}


def _resolve_task(name: str, base: str, params: dict[str, Any], cap: Capacity, fit: PolicyParams | None,
                  block_size: int) -> tuple[str, str, dict[str, Any], Capacity]:
    if base != FITTED:
        return name, base, params, cap
    assert fit is not None
    pol, chosen, _ = resolve_fitted(fit, cap.num_blocks, block_size)
    return name, pol, {**chosen, **params}, cap


def prepare_stream(tables: RunTables, engine_block_size: int | None, fit: PolicyParams | None = None) -> Stream:
    """The run's stream (TABLES), regrouped to ENGINE_BLOCK_SIZE when given, with the categories FIT keys on."""
    stream = load_stream(tables, context=fit.context if fit else None)
    return regroup(stream, engine_block_size) if engine_block_size else stream


class RowSink:
    """The rows of a sweep as they finish: kept (finished and failed apart), appended to results.jsonl
    when there is one (created empty here), and passed to ON_RESULT(row, done, total)."""

    def __init__(self, jsonl: Path | None,
                 on_result: Callable[[dict[str, Any], int, int], None] | None = None) -> None:
        self.jsonl, self.on_result = jsonl, on_result
        self.rows: list[dict[str, Any]] = []
        self.failed: list[dict[str, Any]] = []
        if jsonl is not None:
            atomic_write_text(jsonl, "")

    def add(self, row: dict[str, Any], ok: bool, total: int) -> None:
        """Keep ROW (a finished configuration, or a failed one with `error`) and write it out."""
        (self.rows if ok else self.failed).append(row)
        if self.jsonl is not None:
            with self.jsonl.open("a") as f:
                f.write(json.dumps(row, default=json_default) + "\n")
        if self.on_result:
            self.on_result(row, len(self.rows) + len(self.failed), total)


@dataclass(frozen=True)
class SweepInputs:
    """What every sweep (this one, the fleet's) starts from: the policies as (base, variant parameters),
    the policy file, the stream, each reference's next request and the oracle's peak live set."""

    variants: list[tuple[str, dict[str, Any]]]
    fit: PolicyParams | None
    stream: Stream
    next_req: np.ndarray
    peak_live_blocks: int
    model: ModelPreset | None

    def capacities(self, text: str) -> list[Capacity]:
        """The capacities of TEXT (every unit simulate takes) for this stream."""
        return parse_capacities(text, num_distinct=self.stream.num_ids, block_size_tokens=self.stream.block_size,
                                model=self.model, peak_live=self.peak_live_blocks)


def sweep_inputs(run: RunDir, cfg: SweepConfig) -> SweepInputs:
    """The inputs of CFG's sweep over RUN, every policy's parameters checked before any work; a UsageError
    when WA or `fitted` has no policy file or RUN has no block reference."""
    variants = [policy_variant(p) for p in cfg.policies]
    fit: PolicyParams | None = load_policy(cfg.params_path) if cfg.params_path else None
    needy = [base for base, _ in variants if base in ("wa", FITTED)]
    if fit is None and needy:
        raise UsageError(f"policy {needy[0]} needs fitted parameters: run 'kvtrace fit {run.path}' first "
                         "(simulate then uses its fit/policy.json) or pass --policy-file FILE")
    for base, _ in variants:
        if base != FITTED:
            get_policy(base).make_params({**cfg.policy_params.get(base, {})})
    stream = prepare_stream(run.tables(), cfg.engine_block_size, fit)
    if stream.num_refs == 0:
        if cfg.engine_block_size:
            longest = int(run.requests()["input_tokens"].to_numpy().max(initial=0))
            raise UsageError(f"--engine-block-size {cfg.engine_block_size}: no request fills one block of that many "
                             f"tokens (the longest prompt has {longest:,}); give a size of at most {longest:,}")
        raise UsageError(f"{run.path}: no block references to simulate")
    next_req = next_request_of_refs(stream.req_off, stream.blk, stream.num_ids)
    return SweepInputs(variants, fit, stream, next_req, int(peak_live_blocks(stream.req_off, next_req)), cfg.model)


def run_sweep(run: RunDir, cfg: SweepConfig,
              on_result: Callable[[dict[str, Any], int, int], None] | None = None) -> SweepResult:
    """Simulate every policy x capacity of CFG over RUN; call ON_RESULT(row, done, total) as each ends."""
    inputs = sweep_inputs(run, cfg)
    variants, fit, stream, next_req = inputs.variants, inputs.fit, inputs.stream, inputs.next_req
    prov = run.provenance()
    warnings = policy_warnings(fit, stream.categories, prov.get("run_id"), prov.get("block_size"),
                               FITTED in {base for base, _ in variants}) if fit else []
    caps = inputs.capacities(cfg.capacities)
    hbm = inputs.capacities(cfg.hbm_capacity)[0] if cfg.hbm_capacity else None
    curve = lru_curve(stream)
    out_dir = sweep_dir(run, cfg.name) if cfg.write else None
    stage = staging_dir(run.path) if out_dir else None  # the new set, committed at the end (artifact_set.py)
    sink = RowSink(stage / "results.jsonl" if stage else None, on_result)
    tasks = [_resolve_task(name, base, {**cfg.policy_params.get(base, {}), **over}, cap, fit, stream.block_size)
             for name, (base, over) in zip(cfg.policies, variants, strict=True) for cap in caps]
    rows, failed = sink.rows, sink.failed
    guard_tables: list[dict[str, list[dict[str, Any]]]] = []
    per_request: dict[tuple[str, str], dict[str, Any]] = {}  # (policy, capacity) -> its per-request arrays
    queue = _by_cost(tasks)

    def done(out: TaskOutcome) -> None:
        name, base, _, cap = queue[out.index]
        row = out.value if out.ok else {"policy": name, "base_policy": base, "capacity": cap.label,
                                        "capacity_blocks": cap.num_blocks, "error": out.error}
        arrays = {k: row.pop(k) for k in (HITS, QTTFT) if k in row}
        if arrays:
            per_request[(name, cap.label)] = arrays
        guard_tables.append(pop_guard_tables(row))
        sink.add(row, out.ok, len(tasks))

    t0 = time.perf_counter()
    shared = _shared(stream, next_req, fit, hbm, cfg.cost, cfg.hbm_policy) | {"intervals": cfg.intervals}
    map_tasks(_worker_task, queue, shared, done, ExecutorOptions(cfg.executor, cfg.ray_address, cfg.jobs))
    order = {(n, c.label): i for i, (n, _, _, c) in enumerate(tasks)}
    rows.sort(key=lambda r: order[(r["policy"], r["capacity"])])
    failed.sort(key=lambda r: order[(r["policy"], r["capacity"])])
    intervals = (sweep_intervals(stream, run.requests()["session_id"].to_numpy(), rows, per_request, curve,
                                 cfg.confidence) if cfg.intervals else None)
    per_request.clear()
    summary = {
        "schema": SIM_SCHEMA, "run_dir": str(run.path.resolve()), "num_requests": stream.num_requests,
        "num_refs": stream.num_refs,
        "num_distinct_blocks": stream.num_ids, "block_size": stream.block_size,
        "engine_block_size": cfg.engine_block_size, "ideal_hit_ratio": stream.ideal_hits() / stream.num_refs,
        "peak_live_blocks": inputs.peak_live_blocks, "capacities": [asdict(c) for c in caps],
        "hbm_capacity": asdict(hbm) if hbm else None, "hbm_policy": cfg.hbm_policy,
        "model": cfg.model.name if cfg.model else None,
        "model_shape": asdict(cfg.model) if cfg.model else None,
        "cost_model": asdict(cfg.cost) if cfg.cost else None, "params_path": cfg.params_path,
        "policies": cfg.policies, "lru_curve_elapsed_s": curve.elapsed_s,
        "elapsed_s": time.perf_counter() - t0, "warnings": warnings, "executor": cfg.executor,
        "num_failed": len(failed),
        "num_saturated": sum(bool(r.get("saturated")) for r in rows),
        "failed": failed,
        "intervals": intervals,
    }
    steps = curve.steps()
    if out_dir and stage:
        _write_artifacts(stage, rows, summary, steps)
        write_guard_tables(stage, guard_tables)
        commit_sweep(run, cfg, stage, out_dir, summary)
    return SweepResult(rows, summary, steps)


def policy_warnings(fit: PolicyParams, categories: tuple[str, ...], run_id: str | None,
                    block_size: int | None = None, fitted: bool = False) -> list[str]:
    """What a user should know before trusting FIT on this run: another trace's fit whose categories do
    not occur here (every category then falls back to the file's `default`), a fit made at another block
    size than BLOCK_SIZE (the run's), and `fitted` (FITTED) from a file without choices per capacity."""
    out = []
    fit_block = fit.trace.get("block_size")
    if block_size is not None and isinstance(fit_block, int) and fit_block != block_size:
        out.append(f"the policy file was fitted at {fit_block}-token blocks, this run has {block_size}-token blocks: "
                   "its reuse times and lifespans were measured on other blocks; fit this run ('kvtrace fit')")
    if fitted and not fit.choices:
        out.append("-p fitted: the policy file has no choice per capacity (it was fitted without --capacity), so "
                   "'fitted' runs its WA parameters at every capacity; run 'kvtrace fit RUN --capacity ...'")
    known = [c for c in categories if c in fit.categories]
    other = fit.trace.get("run_id") not in (None, run_id)
    if not known and fit.categories:
        out.append(f"none of this run's {len(categories)} categories is in the policy file: every one uses "
                   "its 'default' parameters" + (" (the file was fitted on another trace)" if other else ""))
    elif other:
        out.append(f"the policy file was fitted on another trace; {len(categories) - len(known)} of this run's "
                   f"{len(categories)} categories are not in it and use its 'default' parameters")
    return out


def _by_cost(tasks: list[Any]) -> list[Any]:
    """Largest capacities and slow policies first, so the pool ends evenly."""
    slow = {"oracle": 3, "gdsf": 2, "lfu": 2, "s3fifo": 1}
    return sorted(tasks, key=lambda t: (-slow.get(t[1], 0), -t[3].num_blocks))


def _shared(stream: Stream, next_req: np.ndarray, fit: PolicyParams | None, hbm: Capacity | None,
            cost: CostModel | None, hbm_policy: str | None = None) -> dict[str, Any]:
    """What every task reads: the stream (sim/shared_stream.py: shipped once per sweep) and the sweep's settings."""
    out = share_streams({"stream": stream})
    out.update(next_req=next_req, fit=fit, hbm=hbm, hbm_policy=hbm_policy, cost=cost)
    return out


def _worker_task(task: tuple[str, str, dict[str, Any], Capacity], shared: Mapping[str, Any]) -> dict[str, Any]:
    """One policy x capacity (runs in an executor's worker)."""
    name, base, params, cap = task
    hbm: Capacity | None = shared["hbm"]
    cost: CostModel | None = shared["cost"]
    stream = worker_stream(shared, "stream")
    nxt = shared["next_req"] if base == Policy.ORACLE.value else None
    guarded = simulate_guarded(stream, base, cap.num_blocks, params=params, fit=shared["fit"], next_req=nxt)
    res = guarded.result
    row = guarded.summary()
    row.update(policy=name, base_policy=base, capacity=cap.label, refs_per_s=res.refs_per_s)
    if shared.get("intervals"):
        row[HITS] = res.req_hit_blocks
    if cost is not None:
        hit_tok, loaded = res.req_hit_tokens, None
        if hbm is not None and hbm.num_blocks < cap.num_blocks:  # two tiers (sim/simulate.py): exact
            tiers = simulate_tiered(stream, base, cap.num_blocks, hbm.num_blocks, hbm_policy=shared["hbm_policy"],
                                    params=params, fit=shared["fit"], next_req=nxt)
            row.update(hbm_policy=tiers.hbm.policy, tiered_hit_ratio=tiers.hit_ratio,
                       hbm_hit_ratio=tiers.hbm_hit_ratio, dram_hit_ratio=tiers.dram_hit_ratio)
            hit_tok, loaded = tiers.hbm.req_hit_tokens, tiers.req_dram_hit_tokens
        row.update(queue_summary(cost, stream.req_time_s, stream.req_tokens - hit_tok, loaded))
        if shared.get("intervals"):
            row[QTTFT] = qttft_s(cost, stream.req_time_s, stream.req_tokens - hit_tok, loaded)
    return row


RESERVED_SWEEP_NAMES = frozenset({"fleet", "guard"})  # RUN/sim/ subfolders of other steps


def sweep_dir(run: RunDir, name: str | None) -> Path:
    """RUN/sim/ for an unnamed sweep, RUN/sim/NAME/ for a named one (its earlier files are replaced when the
    new sweep commits)."""
    root = run.subdir("sim")
    if not name:
        return root
    if name in RESERVED_SWEEP_NAMES or not name.replace("-", "").replace("_", "").replace(".", "").isalnum() \
            or name.startswith("."):
        raise UsageError(f"--name {name!r}: use letters, digits, '-', '_' or '.', not {sorted(RESERVED_SWEEP_NAMES)}")
    return root / name


def commit_sweep(run: RunDir, cfg: SweepConfig, stage: Path, out_dir: Path, summary: dict[str, Any]) -> None:
    """Commit the sweep of CFG staged in STAGE to OUT_DIR as one step (artifact_set.py); a named sweep is also
    RUN/sim/'s set (the latest), and the first full unnamed sweep also RUN/sim/first/, then pinned
    (recommend.pin_after_sweep): the report reads the pin, not whatever one-off ran last. The sizing is
    remembered after (RUN/sizing.json)."""
    sim_root, name = run.subdir("sim"), cfg.name
    sets = [(stage, out_dir)]
    if name:
        sets.append((copy_staged(run.path, stage), sim_root))
    first = first_sweep_due(sim_root, name, summary)
    if first:
        sets.append((copy_staged(run.path, stage), sim_root / FIRST_SWEEP))
    commit_sets(run.path, sets, "simulate", run.provenance().get("run_id"))
    pin_after_sweep(sim_root, name, first)
    if cfg.sizing is not None:
        remember_sizing(run.path, cfg.sizing, "simulate")


def list_sweeps(run_path: Path) -> list[str]:
    """Names of the named sweeps in RUN/sim/ (folders holding a summary.json), sorted."""
    root = Path(run_path) / "sim"
    if not root.is_dir():
        return []
    return sorted(d.name for d in root.iterdir()
                  if d.name not in RESERVED_SWEEP_NAMES and (d / "summary.json").is_file())


def _write_artifacts(out: Path, rows: list[dict[str, Any]], summary: dict[str, Any],
                     steps: dict[str, np.ndarray]) -> None:
    flat = [{k: (json.dumps(v) if k == "params" else v) for k, v in r.items() if k != "per_category"}
            for r in rows]
    write_parquet_atomic(pl.DataFrame(flat), out / "results.parquet")
    cats = [{"policy": r["policy"], "capacity": r["capacity"], "capacity_blocks": r["capacity_blocks"],
             "category": c, **v} for r in rows for c, v in r["per_category"].items()]
    write_parquet_atomic(pl.DataFrame(cats), out / "per_category.parquet")
    write_parquet_atomic(pl.DataFrame(steps), out / "lru_curve.parquet")
    write_json(out / "summary.json", summary)


@dataclass(frozen=True)
class SimulateOptions:
    """`kvtrace simulate`'s options as given on the command line."""

    policies: str = DEFAULT_POLICIES
    capacities: str = DEFAULT_CAPACITIES
    params_path: Path | None = None
    engine_block_size: int | None = None
    model: str | None = None  # preset name or a Hugging Face config.json path; None: the run's (models.run_sizing)
    gpu_mem_gib: float | None = None
    tp: int | None = None
    hbm_capacity: str | None = None
    hbm_policy: str | None = None
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
    executor: str = "local"
    ray_address: str | None = None
    name: str | None = None
    intervals: bool = True  # --no-intervals turns them off
    confidence: float = DEFAULT_CONFIDENCE


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

    if opts.jobs < 0:
        raise UsageError(f"--jobs {opts.jobs}: give 0 (one per core) or a positive number")
    if opts.engine_block_size is not None and opts.engine_block_size <= 0:
        raise UsageError(f"--engine-block-size must be positive, got {opts.engine_block_size}")
    names = parse_policies(opts.policies)
    if opts.ablation:
        if "wa" not in names:
            names.append("wa")
        names += [v for v in WA_ABLATION if v not in names]
    params: dict[str, dict[str, Any]] = {k: dict(v) for k, v in parse_sets(opts.sets).items()}
    bases = {policy_variant(n)[0] for n in names}
    unused = [p for p in params if p not in bases and FITTED not in bases]
    if unused:
        raise UsageError(f"--set {unused[0]}.*: policy {unused[0]} is not simulated (-p {','.join(names)}); add it "
                         "to -p or drop the --set")
    wa = params.setdefault("wa", {})
    if opts.wa_no_life:
        wa["use_life"] = False
    if opts.wa_conditional:
        wa["conditional"] = True
    if opts.wa_no_offset:
        wa["use_offset"] = False
    model = get_preset(opts.model or DEFAULT_MODEL, gpu_mem_gib=opts.gpu_mem_gib, tp=opts.tp)
    cost = override(preset_cost(opts.cost_model or model), overhead_s=opts.overhead_s,
                    s_per_token=opts.s_per_token, s_per_loaded_token=opts.s_per_loaded_token,
                    arrival_scale=opts.arrival_scale)
    if opts.cost_from is not None:
        cost = calibrate_from_replay(opts.cost_from, cost)
    return SweepConfig(policies=names, capacities=opts.capacities, model=model, policy_params=params,
                       params_path=opts.params_path, engine_block_size=opts.engine_block_size,
                       hbm_capacity=opts.hbm_capacity, hbm_policy=hbm_policy(opts), cost=cost, jobs=opts.jobs,
                       executor=opts.executor,
                       ray_address=opts.ray_address, name=opts.name, intervals=opts.intervals,
                       confidence=check_confidence(opts.confidence))


def hbm_policy(opts: SimulateOptions) -> str | None:
    """--hbm-policy checked: a baseline policy (the tier runs it with its defaults), only with --hbm-capacity."""
    if opts.hbm_policy is None:
        return None
    if not opts.hbm_capacity:
        raise UsageError("--hbm-policy needs --hbm-capacity (the HBM tier it names the policy of)")
    name = get_policy(opts.hbm_policy.strip().lower()).name
    if name not in {p.value for p in BASELINES}:
        raise UsageError(f"--hbm-policy {opts.hbm_policy}: give one of {', '.join(p.value for p in BASELINES)} "
                         "(the HBM tier runs it with its defaults)")
    return name


def simulate_run(run_dir: Path, opts: SimulateOptions,
                 on_result: Callable[[dict[str, Any], int, int], None] | None = None) -> SweepResult:
    """`kvtrace simulate`: open RUN_DIR, resolve OPTS, run the sweep, write RUN_DIR/sim/."""
    run, cfg = simulate_inputs(run_dir, opts)
    with run.lock():
        return run_sweep(run, cfg, on_result)


def simulate_inputs(run_dir: Path, opts: SimulateOptions) -> tuple[RunDir, SweepConfig]:
    """The run of RUN_DIR (a raw trace ingested first) and OPTS resolved into its SweepConfig (the run's own
    fit/policy.json by default for wa and fitted)."""
    from tongyi_trace.run import open_run
    from tongyi_trace.trace.ingest import ensure_run

    # a raw trace is ingested once into ./<trace name>.kvtrace; a missing path says how to make a run
    run = ensure_run(run_dir) if Path(run_dir).exists() else open_run(run_dir)
    sizing = run_sizing(run.path, opts.model, opts.gpu_mem_gib, opts.tp)
    cfg = replace(build_config(replace(opts, model=sizing.model, gpu_mem_gib=sizing.gpu_mem_gib, tp=sizing.tp)),
                  sizing=sizing)
    fitted_file = run.path.resolve() / "fit" / "policy.json"  # the run's own `kvtrace fit` output is the default
    if cfg.params_path is None and fitted_file.is_file() and any(
            policy_variant(p)[0] in ("wa", FITTED) for p in cfg.policies):
        cfg = replace(cfg, params_path=fitted_file)
    elif cfg.params_path is not None:
        cfg = replace(cfg, params_path=Path(cfg.params_path).resolve())
    return run, cfg


def describe_policies() -> list[dict[str, Any]]:
    """Every policy with its summary and typed parameters (for --list-policies)."""
    from tongyi_trace.sim.registry import REGISTRY

    out = [{"policy": p.value, "summary": s.summary, "needs_params_file": s.needs_fit,
            "parameters": s.describe()} for p, s in REGISTRY.items()]
    out += [{"policy": v, "summary": f"{'WA ablation' if base == Policy.WA else 'bound'}: {base.value} with {over}",
             "needs_params_file": REGISTRY[base].needs_fit, "parameters": []} for v, (base, over) in VARIANTS.items()]
    return out
