"""`kvtrace simulate` within its memory budget (tongyi_trace/budget.py): the plan (whole stream in memory,
with as many policies at once as the budget allows, or streamed) and the streamed sweep.

The whole-stream sweep (sim/sweep.py) holds the stream (WHOLE_BYTES_PER_REF a reference while it is
built, the issue's measured ~93 bytes) and each running policy its state (per distinct block). When the
stream does not fit the budget, the sweep is streamed: the policy x capacity simulations in passes over the
run's chunks (sim/chunked.py simulate_chunked_many: each chunk read once a pass and served to the pass's
caches on every core; the kernels' states, per cache slot, and one chunk in memory), each pass as wide as the
budget holds at its capacities (`passes`, smallest capacities first); the next uses and the
oracle's peak live set (the `L` capacities) come from one out-of-core pass whose spill file, inside
RUN/sim/, every oracle row reads and which is removed after. A streamed sweep has no LRU curve and no
intervals (both need the whole stream), runs WA without its guard and refit, and says so in its
summary's `memory` notes.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from tongyi_trace.artifact_set import STAGING_PREFIX, staging_dir
from tongyi_trace.budget import (
    BASE_BYTES,
    CHUNK_BYTES_PER_REF,
    MemoryBudget,
    held_now_bytes,
    resolve_budget,
    spill_dir,
    step,
)
from tongyi_trace.errors import UsageError
from tongyi_trace.policy.file import load_policy
from tongyi_trace.run import RunDir, load_provenance, write_json
from tongyi_trace.schemas import SIM_SCHEMA
from tongyi_trace.sim.capacity import parse_capacities
from tongyi_trace.sim.chunked import (
    NOT_STREAMED,
    ChunkedTask,
    ProgressFn,
    simulate_chunked_many,
    stream_shape,
    write_next_uses,
)
from tongyi_trace.sim.cost_model import queue_summary
from tongyi_trace.sim.registry import FITTED, Policy, get_policy
from tongyi_trace.sim.simulate import resolve_fitted
from tongyi_trace.sim.structs import NUM_ROWS, slots_for
from tongyi_trace.sim.sweep import (
    RowSink,
    SimulateOptions,
    SweepConfig,
    SweepResult,
    _write_artifacts,
    commit_sweep,
    policy_variant,
    run_sweep,
    simulate_inputs,
    sweep_dir,
)

T = TypeVar("T")
WHOLE_BYTES_PER_REF = 100  # the whole-stream sweep's peak per reference (the issue measured ~93)
STATE_BYTES_PER_ID = NUM_ROWS * 8 + 16  # a policy's widest state row, its parent and next-use slots
BYTES_PER_REQUEST = 96  # per-request arrays of a sweep (hits, tokens, times, categories, costs)
MAX_PER_PASS = 8  # simulations of one streamed pass of the fit (each chunk is read once for all of them)
SLOT_BYTES = NUM_ROWS * 8 + 16 + 32  # a slot's state row, its map and free-stack entries, two heap entries


def task_bytes(num_ids: int, num_requests: int) -> int:
    """What one running simulation holds beyond the stream: its state over NUM_IDS distinct blocks and its
    per-request arrays over NUM_REQUESTS."""
    return num_ids * STATE_BYTES_PER_ID + num_requests * BYTES_PER_REQUEST


def pass_bytes(num_ids: int, num_requests: int, chunk_refs: int) -> int:
    """What a streamed pass holds once, whatever its simulations: a chunk of CHUNK_REFS references, the
    parents of NUM_IDS blocks and the window's NUM_REQUESTS requests (sim/chunked.py)."""
    return chunk_refs * CHUNK_BYTES_PER_REF + num_ids * 8 + num_requests * BYTES_PER_REQUEST


def slotted_task_bytes(capacity_blocks: int, num_ids: int, num_requests: int,
                       retained_blocks: int | None = None) -> int:
    """What one streamed simulation at CAPACITY_BLOCKS holds (its state per cache slot, structs.slots_for,
    for the cached blocks and the RETAINED_BLOCKS evicted ones its policy keeps: PolicySpec.retained_blocks;
    None: as many as cached, more than any policy keeps), its slot map over NUM_IDS and its per-request
    arrays over NUM_REQUESTS."""
    retained = capacity_blocks if retained_blocks is None else retained_blocks
    slots = slots_for(capacity_blocks, retained, num_ids)
    return slots * SLOT_BYTES + num_ids * 4 + num_requests * BYTES_PER_REQUEST


def pass_fits(capacities_blocks: list[int], num_ids: int, num_requests: int, budget: MemoryBudget,
              held_bytes: int = BASE_BYTES, retained_blocks: list[int | None] | None = None) -> bool:
    """Whether one streamed pass of simulations at CAPACITIES_BLOCKS (one each; RETAINED_BLOCKS: the evicted
    blocks each keeps, slotted_task_bytes) fits BUDGET beside the HELD_BYTES the process holds already: what
    the pass holds once (pass_bytes) and each simulation's state at its own capacity."""
    held = held_bytes + pass_bytes(num_ids, num_requests, budget.chunk_refs)
    kept = retained_blocks if retained_blocks is not None else [None] * len(capacities_blocks)
    return held + sum(slotted_task_bytes(c, num_ids, num_requests, r)
                      for c, r in zip(capacities_blocks, kept, strict=True)) <= budget.limit_bytes


@dataclass(frozen=True)
class SweepPlan:
    """How a sweep runs within the budget: STREAMED or not, JOBS policies at once, and NOTES saying why."""

    streamed: bool
    jobs: int
    notes: tuple[str, ...]


def plan_sweep(num_refs: int, num_ids: int, num_requests: int, num_tasks: int, jobs: int,
               budget: MemoryBudget, *, streamable: bool) -> SweepPlan:
    """The plan of a sweep of NUM_TASKS rows over a stream of NUM_REFS references, NUM_IDS distinct blocks
    and NUM_REQUESTS requests, asked to run JOBS at once (0: one per core), under BUDGET. STREAMABLE: the
    options allow a streamed sweep (no engine block size, tiers, fleet or Ray)."""
    wanted = min(jobs or os.cpu_count() or 1, max(num_tasks, 1))
    task = task_bytes(num_ids, num_requests)
    whole = num_refs * WHOLE_BYTES_PER_REF
    gib = budget.limit_gib
    if BASE_BYTES + whole + task <= budget.limit_bytes or not streamable:
        fit = budget.parallel_tasks(whole, task, wanted)
        notes = () if fit >= wanted else (
            f"{fit} of {wanted} simulations at once: each needs ~{task / 2**30:.1f} GiB of the "
            f"--memory-limit-gib {gib:g} budget",)
        return SweepPlan(False, fit, notes)
    return SweepPlan(True, 1, (
        f"streamed: the whole stream (~{whole / 2**30:.1f} GiB) does not fit --memory-limit-gib {gib:g}; the "
        "simulations run in passes over the run's chunks, as many a pass as the budget holds, without the LRU "
        "curve and the intervals",))


def plan_fit(run_dir: Path, jobs: int, budget: MemoryBudget, *, streamable: bool = True) -> SweepPlan:
    """The plan of `kvtrace fit --capacity`'s simulations of RUN_DIR's run under BUDGET (plan_sweep): the
    whole stream in memory with JOBS (0: one per core) lowered to the simulations the budget holds at once
    (0 stays 0 when it holds one per core, so that a small fit runs in this process: executor.sized_for),
    or, when the whole stream does not fit and STREAMABLE (the local executor), streamed: the candidates
    simulated in passes over the run's chunks, up to JOBS (0: MAX_PER_PASS) a pass, each pass lowered to what
    the budget holds at its capacities (passes, called by fit/tune.py once the capacities are known)."""
    prov = load_provenance(RunDir(Path(run_dir)))
    num_refs, num_ids = int(prov.get("num_block_refs") or 0), int(prov.get("num_distinct_blocks") or 0)
    num_requests = int(prov.get("num_requests") or 0)
    num_cores = os.cpu_count() or 1
    plan = plan_sweep(num_refs, num_ids, num_requests, num_cores, jobs, budget, streamable=streamable)
    if not plan.streamed:
        # not lowered: 0 stays 0, so that a small fit runs in this process (executor.sized_for)
        return replace(plan, jobs=0 if jobs == 0 and plan.jobs >= num_cores else plan.jobs)
    most = jobs or MAX_PER_PASS  # lowered per pass to what the budget holds (passes, at the capacities)
    return SweepPlan(True, most, (
        f"streamed: the whole stream (~{num_refs * WHOLE_BYTES_PER_REF / 2**30:.1f} GiB) does not fit "
        f"--memory-limit-gib {budget.limit_gib:g}; the candidates are simulated in passes over the run's chunks, "
        f"up to {most} a pass (as many as the budget holds beside a chunk)",))


def peak_live_out_of_core(run: RunDir, chunk_refs: int, on_progress: ProgressFn | None = None) -> int:
    """The oracle's peak live set of RUN's whole stream (what the `L` capacities multiply), counted out of
    core by write_next_uses in chunks of CHUNK_REFS references (its spill folder inside RUN, removed after)."""
    shape = stream_shape(run)
    with spill_dir(Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}peak-", dir=run.path))) as tmp:
        return write_next_uses(run, shape, chunk_refs, tmp / "next_uses.i64", on_progress)


def passes(tasks: list[T], blocks_of: Callable[[T], int], num_ids: int, num_requests: int, budget: MemoryBudget,
           most: int = MAX_PER_PASS, held_bytes: int = BASE_BYTES,
           retained_of: Callable[[T], int] | None = None) -> list[list[T]]:
    """TASKS grouped into the passes of a streamed simulation over NUM_IDS blocks and NUM_REQUESTS requests:
    smallest capacities (BLOCKS_OF a task) first, each pass taking the next task while the budget holds the
    pass with it beside HELD_BYTES (pass_fits: each at its own capacity, keeping RETAINED_OF evicted blocks,
    None: as many as cached; at most MOST; a task alone always makes a pass)."""
    todo = sorted(tasks, key=blocks_of)
    out = []
    while todo:
        width = 1
        while width < min(len(todo), most) and pass_fits(
                [blocks_of(t) for t in todo[:width + 1]], num_ids, num_requests, budget, held_bytes,
                None if retained_of is None else [retained_of(t) for t in todo[:width + 1]]):
            width += 1
        out.append(todo[:width])
        todo = todo[width:]
    return out


def streamable(cfg: SweepConfig) -> bool:
    """Whether a SweepConfig may be streamed (sim/chunked.py's limits)."""
    return (cfg.engine_block_size is None and cfg.hbm_capacity is None and cfg.executor == "local"
            and not any(p.split("-")[0] in NOT_STREAMED for p in cfg.policies))


def run_streamed_sweep(run: RunDir, cfg: SweepConfig, budget: MemoryBudget, plan: SweepPlan,
                       on_result: Callable[[dict[str, Any], int, int], None] | None = None,
                       on_progress: ProgressFn | None = None) -> SweepResult:
    """The sweep of CFG over RUN, streamed (module doc): rows as the whole-stream sweep's, but for the
    intervals and the guard's."""
    fit = load_policy(cfg.params_path) if cfg.params_path else None
    variants = [policy_variant(p) for p in cfg.policies]
    needy = [base for base, _ in variants if base in ("wa", FITTED)]
    if fit is None and needy:
        raise UsageError(f"policy {needy[0]} needs fitted parameters: run 'kvtrace fit {run.path}' first "
                         "(simulate then uses its fit/policy.json) or pass --policy-file FILE")
    shape = stream_shape(run, fit.context if fit else None)
    if shape.num_refs == 0:
        raise UsageError(f"{run.path}: no block references to simulate")
    out_dir = sweep_dir(run, cfg.name) if cfg.write else None
    stage = staging_dir(run.path) if out_dir else None  # the new set, committed at the end (artifact_set.py)
    sink = RowSink(stage / "results.jsonl" if stage else None, on_result)
    notes = list(plan.notes)
    t0 = time.perf_counter()
    with spill_dir(Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}streamed-", dir=run.path))) as tmp:
        nxt_path = tmp / "next_uses.i64"
        peak = write_next_uses(run, shape, budget.chunk_refs, nxt_path, on_progress)
        caps = parse_capacities(cfg.capacities, num_distinct=shape.num_ids, block_size_tokens=shape.block_size,
                                model=cfg.model, peak_live=peak)
        tasks = []
        for name, (base, over) in zip(cfg.policies, variants, strict=True):
            for cap in caps:
                params = {**cfg.policy_params.get(base, {}), **over}
                pol = base
                if base == FITTED:
                    assert fit is not None
                    pol, chosen, _ = resolve_fitted(fit, cap.num_blocks, shape.block_size)
                    params = {**chosen, **params}
                if pol == Policy.WA.value and (params.get("guard", True) or params.get("refit_s")):
                    params = {**params, "guard": False, "refit_s": 0.0}
                    if not any("guard" in n for n in notes):
                        notes.append("streamed: WA runs without its guard and refit")
                tasks.append((name, base, pol, params, cap))
        widest = 0
        for group in passes(tasks, lambda t: t[-1].num_blocks, shape.num_ids, shape.num_requests, budget,
                            held_bytes=held_now_bytes(),
                            retained_of=lambda t: get_policy(t[2]).retained_blocks(t[3], t[-1].num_blocks)):
            widest = max(widest, len(group))
            with step("simulate " + ", ".join(f"{name} @ {cap.label}" for name, _, _, _, cap in group)):
                results = simulate_chunked_many(run, [ChunkedTask(pol, cap.num_blocks, params)
                                                      for _, _, pol, params, cap in group],
                                                chunk_refs=budget.chunk_refs, fit=fit, next_uses=nxt_path,
                                                on_progress=on_progress)
            for (name, base, _, _, cap), res in zip(group, results, strict=True):
                row = {**res.summary(), "policy": name, "base_policy": base, "capacity": cap.label,
                       "capacity_blocks": cap.num_blocks, "refs_per_s": res.refs_per_s}
                if cfg.cost is not None:
                    row.update(queue_summary(cfg.cost, shape.req_time_s, shape.req_tokens - res.req_hit_tokens))
                sink.add(row, True, len(tasks))
    order = {(name, cap.label): i for i, (name, _, _, _, cap) in enumerate(tasks)}
    sink.rows.sort(key=lambda r: order[(r["policy"], r["capacity"])])  # as the whole-stream sweep's
    summary = {
        "schema": SIM_SCHEMA, "run_dir": str(run.path.resolve()), "num_requests": shape.num_requests,
        "num_refs": shape.num_refs, "num_distinct_blocks": shape.num_ids, "block_size": shape.block_size,
        "engine_block_size": None, "ideal_hit_ratio": (shape.num_refs - shape.num_ids) / shape.num_refs,
        "peak_live_blocks": peak, "capacities": [asdict(c) for c in caps], "hbm_capacity": None,
        "hbm_policy": None, "model": cfg.model.name if cfg.model else None,
        "model_shape": asdict(cfg.model) if cfg.model else None,
        "cost_model": asdict(cfg.cost) if cfg.cost else None, "params_path": cfg.params_path,
        "policies": cfg.policies, "lru_curve_elapsed_s": 0.0, "elapsed_s": time.perf_counter() - t0,
        "warnings": [], "executor": cfg.executor, "num_failed": 0,
        "num_saturated": sum(bool(r.get("saturated")) for r in sink.rows), "failed": [], "intervals": None,
        "memory": {"limit_gib": budget.limit_gib, "streamed": True, "jobs": widest, "notes": notes},
    }
    steps = {"capacity_blocks": np.zeros(1, np.int64), "hit_ratio": np.zeros(1), "token_hit_ratio": np.zeros(1)}
    if out_dir and stage:
        _write_artifacts(stage, sink.rows, summary, steps)
        commit_sweep(run, cfg, stage, out_dir, summary)
    return SweepResult(sink.rows, summary, steps)


def simulate_budgeted(run_dir: Path, opts: SimulateOptions, limit_gib: float | None,
                      on_result: Callable[[dict[str, Any], int, int], None] | None = None,
                      on_progress: ProgressFn | None = None) -> SweepResult:
    """`kvtrace simulate --memory-limit-gib LIMIT_GIB` (None: the default budget): sweep.simulate_run with
    the sweep planned within the budget (plan_sweep); the plan's notes are in the summary's `memory`."""
    budget = resolve_budget(limit_gib)
    run, cfg = simulate_inputs(run_dir, opts)
    prov = run.provenance()
    num_tasks = len(cfg.policies) * max(1, len([c for c in cfg.capacities.split(",") if c.strip()]))
    plan = plan_sweep(int(prov.get("num_block_refs") or 0), int(prov.get("num_distinct_blocks") or 0),
                      int(prov.get("num_requests") or 0), num_tasks, cfg.jobs, budget, streamable=streamable(cfg))
    with run.lock():
        if plan.streamed:
            return run_streamed_sweep(run, cfg, budget, plan, on_result, on_progress)
        with step("simulate"):
            result = run_sweep(run, replace(cfg, jobs=plan.jobs), on_result)
    result.summary["memory"] = {"limit_gib": budget.limit_gib, "streamed": False, "jobs": plan.jobs,
                                "notes": list(plan.notes)}
    if cfg.write:
        for d in {run.path / "sim", run.path / "sim" / (cfg.name or "")}:
            if (d / "summary.json").is_file():
                write_json(d / "summary.json", result.summary)
    return result
