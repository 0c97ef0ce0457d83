"""`kvtrace simulate`: replay a run through eviction policies x cache capacities (the embedded engine)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from tongyi_trace.cli import app, source_value
from tongyi_trace.cli._common import console, print_json, progress, run_cli, say
from tongyi_trace.cli._plan import print_recommendation, print_sweeps, recommendation_json
from tongyi_trace.errors import UsageError
from tongyi_trace.models import DEFAULT_MODEL
from tongyi_trace.sim.registry import DEFAULT_CAPACITIES, DEFAULT_POLICIES, VARIANTS, Policy

if TYPE_CHECKING:  # the simulator (numba) is imported when a command runs, not for --help
    from rich.table import Table

    from tongyi_trace.sim.sweep import SweepResult


@app.command()
def simulate(
    run_dir: Path | None = typer.Argument(None, help="Run folder written by 'kvtrace ingest', or a raw trace "
                                        "(ingested first into ./<trace name>.kvtrace)."),
    policy: str = typer.Option(DEFAULT_POLICIES, "--policies", "--policy", "-p",
                               help=f"Comma-separated: {','.join(Policy)} (or all); fitted (the policy file's "
                                    "choice per capacity); the variants "
                                    f"{','.join(VARIANTS)}."),
    capacity: str = typer.Option(DEFAULT_CAPACITIES, "--capacity", "-c",
                                 help="Comma-separated: blocks (4096), % of distinct blocks (5%), x HBM of "
                                      "--model (0.5x), x the oracle's peak live set (2L), bytes of KV with "
                                      "--model's bytes per block (40GiB, 200GB), inf."),
    params: Path | None = typer.Option(None, "--policy-file", "--params",
                                       help="Policy file from 'kvtrace fit' for wa/fitted (default: "
                                            "RUN_DIR/fit/policy.json)."),
    engine_block_size: int | None = typer.Option(None, "--engine-block-size",
                                                 help="Regroup trace blocks to this many tokens a block."),
    model: str | None = typer.Option(None, "--model", help="Model preset or Hugging Face config.json path (x HBM "
                                     "and byte capacities, QTTFT; default: the model the run was last sized with, "
                                     f"else {DEFAULT_MODEL})."),
    gpu_mem_gib: float | None = typer.Option(None, "--gpu-mem", "--gpu-mem-gib",
                                             help="Override: memory per GPU in GiB (80)."),
    tp: int | None = typer.Option(None, "--tp", help="Override: tensor-parallel degree (GPUs)."),
    hbm_capacity: str | None = typer.Option(None, "--hbm-capacity",
                                            help="HBM part of the cache (same units); the rest is a CPU "
                                                 "tier whose hits cost a load (QTTFT)."),
    hbm_policy: str | None = typer.Option(None, "--hbm-policy", help="The HBM tier's policy (a baseline, e.g. lru "
                                          "as vLLM runs it), the DRAM tier running --policies (default: the same)."),
    prefill_overhead_s: float | None = typer.Option(None, "--prefill-overhead-s", help="Cost model a (s)."),
    prefill_s_per_token: float | None = typer.Option(None, "--prefill-s-per-token",
                                                     help="Cost model b (s per uncached token)."),
    load_s_per_token: float | None = typer.Option(None, "--load-s-per-token",
                                                  help="Cost model c (s per token loaded from CPU)."),
    arrival_scale: float | None = typer.Option(None, "--arrival-scale",
                                               help="Multiply arrival times (>1 lightens the load)."),
    cost_from: Path | None = typer.Option(None, "--cost-from",
                                          help="Run folder with replay records: fit a, b to the engine."),
    wa_no_life: bool = typer.Option(False, "--wa-no-life", help="WA without the lifespan regulator."),
    wa_conditional: bool = typer.Option(False, "--wa-conditional", help="WA conditioned on no reuse by t."),
    wa_no_offset: bool = typer.Option(False, "--wa-no-offset", help="WA without the -offset tie-break."),
    ablation: bool = typer.Option(False, "--ablation", help="Also run the WA ablation variants (wa-no-life, "
                                  "wa-conditional, wa-no-offset, wa-no-guard)."),
    set_: list[str] = typer.Option([], "--set", help="POLICY.PARAMETER=VALUE (see --list-policies)."),
    jobs: int = typer.Option(0, "--jobs", "-j", help="Worker processes (0 = one per core; fewer when the memory "
                             "budget holds fewer simulations at once)."),
    memory_limit_gib: float | None = typer.Option(None, "--memory-limit-gib", help="Memory budget of the whole "
                                                  "process, GiB (default: a quarter of this machine's, at most 6). "
                                                  "A stream that does not fit is simulated in chunks."),
    executor: str = typer.Option("local", "--executor", help="Where the simulations run: local (process pool) "
                                 "or ray (a Ray cluster; pip install 'kvtrace[ray]')."),
    ray_address: str | None = typer.Option(None, "--ray-address", metavar="ADDR",
                                           help="Ray cluster to use (default: $RAY_ADDRESS, else start a "
                                                "local Ray instance)."),
    instances: str | None = typer.Option(None, "--instances", help="Fleet: instance counts (1,2,4,8); capacity "
                                         "is then per instance (docs/fleet.md)."),
    router: str | None = typer.Option(None, "--router", help="Fleet routers: rr,least-loaded,session,prefix,"
                                      "kv-aware,oracle-affinity or all; NAME:KEY=VALUE sets a parameter."),
    remote_capacity: str | None = typer.Option(None, "--remote-capacity", help="Fleet: one shared remote KV pool."),
    remote_load_s_per_token: float | None = typer.Option(None, "--remote-load-s-per-token",
                                                         help="Fleet: s per token loaded from the remote pool."),
    name: str | None = typer.Option(None, "--name", help="Keep this sweep in RUN_DIR/sim/NAME/ (replacing a sweep "
                                    "of that name) and pin it: the report reads it (without a pin: the first full "
                                    "sweep); the latest sweep is also RUN_DIR/sim/."),
    no_intervals: bool = typer.Option(False, "--no-intervals", help="Skip the intervals of every gain over LRU, "
                                      "QTTFT change and target size (block bootstrap over sessions)."),
    confidence: float = typer.Option(source_value("sim.bootstrap", "DEFAULT_CONFIDENCE"), "--confidence",
                                     help="Confidence level of the intervals; a policy is recommended over LRU "
                                          "only when its gain is significant at it."),
    list_policies: bool = typer.Option(False, "--list-policies", help="Print the policies and parameters."),
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print every policy x capacity row with its "
                                 "developer columns (always in RUN_DIR/sim/results.parquet)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress and no table."),
) -> None:
    """Simulate eviction policies x capacities over RUN_DIR with vLLM's prefix-cache semantics."""
    if list_policies:
        _print_policies(json_out)
        return
    if run_dir is None:
        run_cli(_missing_run)
        return
    from tongyi_trace.budget import resolve_budget
    from tongyi_trace.sim.sweep import SimulateOptions

    opts = SimulateOptions(
        policies=policy, capacities=capacity, params_path=params, engine_block_size=engine_block_size,
        model=model, gpu_mem_gib=gpu_mem_gib, tp=tp, hbm_capacity=hbm_capacity, hbm_policy=hbm_policy,
        overhead_s=prefill_overhead_s,
        s_per_token=prefill_s_per_token, s_per_loaded_token=load_s_per_token, arrival_scale=arrival_scale,
        cost_from=cost_from, wa_no_life=wa_no_life, wa_conditional=wa_conditional, wa_no_offset=wa_no_offset,
        ablation=ablation, sets=tuple(set_), jobs=jobs, executor=executor, ray_address=ray_address, name=name,
        intervals=not no_intervals, confidence=confidence)
    if instances is not None or router is not None or remote_capacity is not None \
            or remote_load_s_per_token is not None:
        from tongyi_trace.cli._fleet import simulate_fleet_cli

        simulate_fleet_cli(run_dir, opts, instances, router, remote_capacity, remote_load_s_per_token,
                           quiet=quiet, json_out=json_out, verbose=verbose)
        return
    with progress(quiet or json_out) as bar:
        task = bar.add_task("simulate", total=None)

        def on_result(row: dict[str, Any], done: int, total: int) -> None:
            bar.update(task, completed=done, total=total,
                       description=f"simulate {row['policy']} @ {row['capacity']}")

        def on_progress(step: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=step)

        def go() -> SweepResult:
            from tongyi_trace.sim.streamed import simulate_budgeted

            return simulate_budgeted(run_dir, opts, memory_limit_gib, on_result, on_progress)

        result = run_cli(go, run_cli(lambda: resolve_budget(memory_limit_gib)))
    if json_out:
        print_json({"summary": result.summary, "rows": result.rows, "recommendation": recommendation_json(result)},
                   "kvtrace.simulate-output/1")
    elif not quiet:
        rec = print_recommendation(result)
        console.print(_table(result) if verbose else _answer_table(rec))
        if not verbose:
            say(f"{len(result.rows)} policy x capacity rows: --verbose, or RUN_DIR/sim/results.parquet")
        for w in result.summary.get("warnings") or []:
            say(("warning:", "yellow"), f" {w}", err=True)
        for note in (result.summary.get("memory") or {}).get("notes") or []:
            say(("memory:", "yellow"), f" {note}", err=True)
        s = result.summary
        console.print(f"ideal hit ratio {s['ideal_hit_ratio']:.4f}; oracle's peak live set "
                      f"{s['peak_live_blocks']:,} blocks; results in {Path(s.get('run_dir', run_dir)) / 'sim'}")
        print_sweeps(Path(s.get("run_dir", run_dir)), name)
    if result.summary["num_failed"]:
        _report_failed(result)


def _report_failed(result: SweepResult) -> None:
    failed = result.summary["failed"]
    first = failed[0]
    say(("error:", "bold red"), f" {len(failed)} of {len(failed) + len(result.rows)} simulations failed "
        f"after a retry (rows with 'error' in sim/results.jsonl); first: {first['policy']} @ "
        f"{first['capacity']}: {first['error']}", err=True)
    raise typer.Exit(1)


def _missing_run() -> None:
    raise UsageError("give a RUN_DIR (or --list-policies)")


def _table(result: SweepResult) -> Table:
    from rich.table import Table

    from tongyi_trace.sim.guarded import guard_cell

    t = Table(title="prefix-cache simulation")
    iv = result.summary.get("intervals")
    cols = ("policy", "capacity", "blocks", "hit ratio",
            *([f"vs LRU pts ({100 * iv['confidence']:g}%)", "QTTFT vs LRU %"] if iv else []), "token hit",
            "evictions", "ns/evict", "QTTFT mean s", "QTTFT p99 s", "M refs/s", "guard")
    for c in cols:
        t.add_column(c, justify="left" if c in ("policy", "capacity") else "right")
    for r in result.rows:
        gains = [_pm(r, "gain_vs_lru", "pp", ".2f"), _pm(r, "qttft_change", "pct", ".1f")] if iv else []
        t.add_row(r["policy"], r["capacity"], f"{r['capacity_blocks']:,}", f"{r['hit_ratio']:.4f}", *gains,
                  f"{r['token_hit_ratio']:.4f}", f"{r['num_evictions']:,}", f"{r['evict_decision_ns']:.0f}",
                  f"{r.get('qttft_mean_s', 0):.3f}", f"{r.get('qttft_p99_s', 0):.3f}",
                  f"{r['refs_per_s'] / 1e6:.1f}", guard_cell(r))
    return t


def _answer_table(rec: dict[str, Any]) -> Table:
    """One row per capacity: LRU, what to run there (the Recommendation's answer) and its gain, QTTFT and
    the queue's utilization (the full sweep: --verbose)."""
    from rich.table import Table

    from tongyi_trace.sim.recommend import answer_cells

    t = Table(title="per capacity (run = the Recommendation's answer)")
    columns, rows = answer_cells(rec)
    for c in columns:
        t.add_column(c, justify="left" if c in ("capacity", "run", "best other") else "right")
    for row in rows:
        t.add_row(*row)
    return t


def _pm(row: dict[str, Any], key: str, unit: str, spec: str) -> str:
    """'+1.20 +- 0.31' from ROW's KEY_UNIT and its interval, '-' without one."""
    point, lo, hi = (row.get(f"{key}{part}_{unit}") for part in ("", "_lo", "_hi"))
    if point is None or lo is None or hi is None:
        return "-"
    return f"{format(point, '+' + spec)} +- {format((hi - lo) / 2, spec)}"


def _print_policies(json_out: bool) -> None:
    from rich.table import Table

    from tongyi_trace.sim.sweep import describe_policies

    rows = describe_policies()
    if json_out:
        print_json({"policies": rows}, "kvtrace.policies/1")
        return
    t = Table(title="policies (--set POLICY.PARAMETER=VALUE)")
    for c in ("policy", "summary", "parameter", "type", "default", "meaning"):
        t.add_column(c)
    for r in rows:
        ps = r["parameters"] or [{"name": "-", "type": "", "default": "", "help": ""}]
        for i, p in enumerate(ps):
            t.add_row(r["policy"] if i == 0 else "", r["summary"] if i == 0 else "", p["name"], p["type"],
                      str(p["default"]), p["help"])
    console.print(t)
