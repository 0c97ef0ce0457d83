"""`kvtrace simulate --instances LIST --router LIST`: every policy x router x instance count x capacity
(per instance) of one run through the fleet simulator, in parallel, written incrementally. One task is
one policy x instance count x capacity with every router in turn, on the same caches (fleet/simulate.py,
CachePool): the block tables are allocated once per task, not once per router.

Artifacts in RUN_DIR/sim/fleet/ (docs/fleet.md):
    results.jsonl    one line per finished configuration, appended as they finish
    results.parquet  the same rows, flat, written at the end
    summary.json     the configuration, tiers, cost model, where the conversations came from
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tongyi_trace.errors import UsageError
from tongyi_trace.executor import ExecutorOptions, TaskOutcome, error_line, map_tasks
from tongyi_trace.fleet.routers import get_router, parse_routers
from tongyi_trace.fleet.simulate import CachePool, Tiers, simulate_fleet
from tongyi_trace.run import RunDir, RunTables, write_json
from tongyi_trace.schemas import FLEET_SCHEMA
from tongyi_trace.sim.capacity import Capacity
from tongyi_trace.sim.registry import Policy
from tongyi_trace.sim.shared_stream import worker_stream
from tongyi_trace.sim.simulate import FITTED, resolve_fitted
from tongyi_trace.sim.stream import Stream
from tongyi_trace.sim.sweep import (
    RowSink,
    SimulateOptions,
    SweepConfig,
    _shared,
    build_config,
    sweep_inputs,
)

TABLE_BYTES_PER_ID = 144  # a Cache's block table (structs.make_state): 16 int64 fields + 2 links per block id
DEFAULT_ROUTERS = "rr,least-loaded,session,prefix,kv-aware"


@dataclass(frozen=True)
class FleetOptions:
    """The fleet's own options of `kvtrace simulate`."""

    instances: str  # comma-separated instance counts
    routers: str = DEFAULT_ROUTERS  # router specs (fleet/routers), or all
    remote_capacity: str | None = None  # one shared remote pool (capacity units), absent by default
    remote_s_per_token: float | None = None  # default: 4 x the cost model's CPU load cost


@dataclass
class FleetSweepResult:
    """One row per configuration, and the sweep's summary."""

    rows: list[dict[str, Any]]
    summary: dict[str, Any]


def parse_instances(text: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8] (each >= 1, no duplicates)."""
    out: list[int] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        try:
            n = int(item)
        except ValueError:
            raise UsageError(f"--instances {item!r} is not a whole number; give e.g. 1,2,4,8") from None
        if not 1 <= n <= 4096:
            raise UsageError(f"--instances {n} is out of range; give 1..4096")
        if n not in out:
            out.append(n)
    if not out:
        raise UsageError("--instances is empty; give e.g. 1,2,4,8")
    return out


def available_memory_bytes() -> int:
    """MemAvailable of /proc/meminfo (free pages where it is absent)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def check_memory(tasks: list[tuple[str, str, dict[str, Any], str, int, Capacity]], num_ids: int, tiers: Tiers,
                 jobs: int) -> None:
    """Refuse a local sweep whose block tables (one per cache, sized by the distinct blocks) cannot fit in
    the memory available now, with what to do."""
    def caches(task: tuple[str, str, dict[str, Any], str, int, Capacity]) -> int:
        _, pol, _, rt, n, cap = task
        tiered = tiers.hbm_blocks is not None and tiers.hbm_blocks < cap.num_blocks
        per = 1 + int(tiered)  # a two-tier instance: HBM and DRAM tables
        per += int(get_router(rt).uses_index and (pol != "lru" or tiered))
        return n * per + int(bool(tiers.remote_blocks))

    biggest = max(caches(t) for t in tasks)
    workers = min(jobs or os.cpu_count() or 1, len(tasks))
    need = biggest * workers * (num_ids + 1) * TABLE_BYTES_PER_ID
    avail = available_memory_bytes()
    if need > avail:
        raise UsageError(f"the fleet sweep needs about {need / 2**30:.1f} GiB of block tables ({biggest} caches of "
                         f"{num_ids:,} distinct blocks x {workers} workers) and {avail / 2**30:.1f} GiB is "
                         "available: give fewer --instances or --jobs 1")


def run_sessions(tables: RunTables, stream: Stream) -> tuple[np.ndarray | None, str]:
    """Each stream request's conversation from the run's requests table (session_id), or None (the
    first block then stands for it) when the trace has no conversations; and where it came from."""
    if not tables.provenance.get("has_sessions"):
        return None, "first block (the trace has no conversations)"
    sess = tables.requests().select("session_id")["session_id"].to_numpy().astype(np.int64)
    return sess[stream.req_idx], "requests.session_id"


def run_fleet_sweep(run: RunDir, cfg: SweepConfig, fleet: FleetOptions,
                    on_result: Callable[[dict[str, Any], int, int], None] | None = None) -> FleetSweepResult:
    """Simulate every policy x router x instance count x capacity of CFG and FLEET over RUN; call
    ON_RESULT(row, done, total) as each ends."""
    routers = parse_routers(fleet.routers)
    counts = parse_instances(fleet.instances)
    assert cfg.cost is not None
    inputs = sweep_inputs(run, cfg)
    variants, fit, stream, next_req = inputs.variants, inputs.fit, inputs.stream, inputs.next_req
    capacities = inputs.capacities
    caps = capacities(cfg.capacities)
    hbm = capacities(cfg.hbm_capacity)[0] if cfg.hbm_capacity else None
    remote = capacities(fleet.remote_capacity)[0] if fleet.remote_capacity else None
    remote_cost = fleet.remote_s_per_token
    if remote_cost is None:
        remote_cost = 4.0 * cfg.cost.s_per_loaded_token
    if not (remote_cost >= 0 and np.isfinite(remote_cost)):
        raise UsageError(f"--remote-load-s-per-token must be a finite number >= 0, got {remote_cost}")
    session, session_source = run_sessions(run.tables(), stream)
    tasks: list[tuple[str, str, dict[str, Any], str, int, Capacity]] = []
    for name, (base, over) in zip(cfg.policies, variants, strict=True):
        for cap in caps:
            pol, params = base, {**cfg.policy_params.get(base, {}), **over}
            if base == FITTED:
                assert fit is not None
                pol, chosen, _ = resolve_fitted(fit, cap.num_blocks, stream.block_size)
                params = {**chosen, **params}
            tasks += [(name, pol, params, rt, n, cap) for rt in routers for n in counts]
    tiers = Tiers(hbm.num_blocks if hbm else None, cfg.hbm_policy, remote.num_blocks if remote else None,
                  remote_cost)
    if cfg.executor == "local":
        check_memory(tasks, stream.num_ids, tiers, cfg.jobs)
    out_dir = run.subdir("sim") / "fleet" if cfg.write else None
    if out_dir:
        out_dir.mkdir(exist_ok=True)
    sink = RowSink(out_dir / "results.jsonl" if out_dir else None, on_result)
    rows, failed = sink.rows, sink.failed
    queue = task_groups(tasks, cfg.jobs or os.cpu_count() or 1)

    def done(out: TaskOutcome) -> None:
        group = queue[out.index]
        values = out.value if out.ok else [{"error": out.error}] * len(group)
        for (name, pol, _, rt, n, cap), row in zip(group, values, strict=True):
            if "error" in row:
                row = {"policy": name, "base_policy": pol, "router": rt, "num_instances": n, "capacity": cap.label,
                       "capacity_blocks": cap.num_blocks, "error": row["error"]}
            sink.add(row, "error" not in row, len(tasks))

    t0 = time.perf_counter()
    shared = _shared(stream, next_req, fit, hbm, cfg.cost)
    shared.update(session=session if session is not None else np.zeros(0, np.int64),
                  tiers=tiers)
    map_tasks(_worker_task, queue, shared, done, ExecutorOptions(cfg.executor, cfg.ray_address, cfg.jobs))
    order = {(t[0], t[3], t[4], t[5].label): i for i, t in enumerate(tasks)}
    for lst in (rows, failed):
        lst.sort(key=lambda r: order[(r["policy"], r["router"], r["num_instances"], r["capacity"])])
    summary = {
        "schema": FLEET_SCHEMA, "num_requests": stream.num_requests, "num_refs": stream.num_refs,
        "num_distinct_blocks": stream.num_ids, "block_size": stream.block_size,
        "engine_block_size": cfg.engine_block_size, "ideal_hit_ratio": stream.ideal_hits() / stream.num_refs,
        "peak_live_blocks": inputs.peak_live_blocks, "capacities_per_instance": [asdict(c) for c in caps],
        "instances": counts, "routers": routers, "policies": cfg.policies,
        "hbm_capacity": asdict(hbm) if hbm else None, "hbm_policy": cfg.hbm_policy,
        "remote_capacity": asdict(remote) if remote else None,
        "remote_s_per_token": remote_cost, "session_source": session_source,
        "model": cfg.model.name if cfg.model else None, "cost_model": asdict(cfg.cost),
        "params_path": cfg.params_path, "elapsed_s": time.perf_counter() - t0, "executor": cfg.executor,
        "num_failed": len(failed), "failed": failed,
    }
    if out_dir:
        flat = [{k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in r.items()} for r in rows]
        pl.DataFrame(flat).write_parquet(out_dir / "results.parquet")
        write_json(out_dir / "summary.json", summary)
    return FleetSweepResult(rows, summary)


def task_groups(tasks: list[tuple[str, str, dict[str, Any], str, int, Capacity]], workers: int
                ) -> list[list[tuple[str, str, dict[str, Any], str, int, Capacity]]]:
    """TASKS as the executor's tasks: the routers of one policy x instance count x capacity together (they
    share the caches), split into up to WORKERS parts when there are fewer such groups than workers (every
    worker busy); biggest fleets first, so the pool ends evenly."""
    groups: dict[tuple[Any, ...], list[tuple[str, str, dict[str, Any], str, int, Capacity]]] = {}
    for t in tasks:
        groups.setdefault((t[0], t[4], t[5].label), []).append(t)
    parts = max(1, -(-workers // len(groups))) if groups else 1
    out = [g[k::parts] for g in groups.values() for k in range(min(parts, len(g)))]
    return sorted(out, key=lambda g: (-g[0][4], -g[0][5].num_blocks))


def _worker_task(group: list[tuple[str, str, dict[str, Any], str, int, Capacity]], shared: Mapping[str, Any]
                 ) -> list[dict[str, Any]]:
    """One policy x instance count x capacity, every router of GROUP in turn on the same caches (runs in an
    executor's worker): a row per router, {"error": ...} for a router that failed."""
    stream = worker_stream(shared, "stream")
    session = shared["session"]
    pool = CachePool()
    rows: list[dict[str, Any]] = []
    for name, pol, params, rt, n, cap in group:
        try:
            res = simulate_fleet(stream, rt, n, pol, cap.num_blocks, params=params, fit=shared["fit"],
                                 next_req=shared["next_req"] if pol == Policy.ORACLE.value else None,
                                 tiers=shared["tiers"], cost=shared["cost"],
                                 session=np.asarray(session) if len(session) else None, pool=pool)
        except Exception as e:  # one router's failure is that row's error; the others still run
            rows.append({"error": error_line(e)})
            continue
        row = res.summary()
        row.update(policy=name, base_policy=pol, router=rt, capacity=cap.label,
                   total_capacity_blocks=cap.num_blocks * n)
        rows.append(row)
    return rows


def fleet_simulate_run(run_dir: Path, opts: SimulateOptions, fleet: FleetOptions,
                       on_result: Callable[[dict[str, Any], int, int], None] | None = None) -> FleetSweepResult:
    """`kvtrace simulate --instances`: open RUN_DIR (a raw trace is ingested first, as `simulate` does),
    resolve OPTS and FLEET, run the sweep, write RUN_DIR/sim/fleet/."""
    from tongyi_trace.models import run_sizing
    from tongyi_trace.run import open_run
    from tongyi_trace.trace.ingest import ensure_run

    run = ensure_run(run_dir) if Path(run_dir).exists() else open_run(run_dir)
    sizing = run_sizing(run.path, opts.model, opts.gpu_mem_gib, opts.tp)
    cfg = build_config(replace(opts, model=sizing.model, gpu_mem_gib=sizing.gpu_mem_gib, tp=sizing.tp))
    with run.lock():
        return run_fleet_sweep(run, cfg, fleet, on_result)
