"""The fleet part of `kvtrace simulate` (--instances, --router, --remote-capacity): progress, the table,
JSON. cli/simulate.py dispatches here when a fleet option is given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from tongyi_trace.cli._common import console, print_json, progress, run_cli, say
from tongyi_trace.errors import UsageError
from tongyi_trace.fleet.sweep import DEFAULT_ROUTERS, FleetOptions, FleetSweepResult, fleet_simulate_run
from tongyi_trace.sim.sweep import SimulateOptions


def simulate_fleet_cli(run_dir: Path, opts: SimulateOptions, instances: str | None, router: str | None,
                       remote_capacity: str | None, remote_s_per_token: float | None, *, quiet: bool,
                       json_out: bool, verbose: bool = False) -> None:
    """Run the fleet sweep with progress (a line every few seconds when not on a terminal); print its
    Recommendation and table (or JSON); exit 1 when a configuration failed."""
    if instances is None:
        given = "--router" if router is not None else "--remote-capacity/--remote-load-s-per-token"
        run_cli(lambda: _needs_instances(given))
        return
    fleet = FleetOptions(instances, router or DEFAULT_ROUTERS, remote_capacity, remote_s_per_token)
    with progress(quiet or json_out, log_every_s=LOG_EVERY_S) as bar:
        task = bar.add_task("fleet", total=None)

        def on_result(row: dict[str, Any], done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=f"fleet {row['router']} x "
                       f"{row['num_instances']} {row['policy']} @ {row['capacity']}")

        result = run_cli(lambda: fleet_simulate_run(run_dir, opts, fleet, on_result))
    from tongyi_trace.sim.recommend import fleet_sentence, recommend_fleet

    rec = recommend_fleet(result.rows)
    if json_out:
        print_json({"summary": result.summary, "rows": result.rows, "recommendation": rec})
    elif not quiet:
        say(("Recommendation", "bold"))
        say("  " + fleet_sentence(rec))
        if _prefix_is_oracle(result):
            say("  prefix = oracle-affinity here: with LRU instances the prefix router's index (an LRU of each "
                "instance's size over what it routed) is the instances' caches (docs/fleet.md).")
        shown = result.rows if verbose or rec["best"] is None else [
            r for r in result.rows if "error" not in r and r["policy"] == rec["best"]["policy"]
            and r["capacity"] == rec["best"]["capacity"]]
        console.print(_table(result, shown))
        if len(shown) < len(result.rows):
            say(f"{len(result.rows)} configurations in all: --verbose, or {run_dir / 'sim' / 'fleet'}")
        console.print(f"ideal hit ratio {result.summary['ideal_hit_ratio']:.4f}; conversations from "
                      f"{result.summary['session_source']}; results in {run_dir / 'sim' / 'fleet'}")
    failed = result.summary["failed"]
    if failed:
        first = failed[0]
        say(("error:", "bold red"), f" {len(failed)} of {len(failed) + len(result.rows)} fleet simulations failed "
            f"(rows with 'error' in sim/fleet/results.jsonl); first: {first['router']} x {first['num_instances']} "
            f"{first['policy']} @ {first['capacity']}: {first['error']}", err=True)
        raise typer.Exit(1)


def _needs_instances(option: str) -> None:
    raise UsageError(f"{option} is a fleet option: give --instances too, e.g. --instances 1,2,4")


LOG_EVERY_S = 5.0  # a progress line this often when stderr is not a terminal


def _prefix_is_oracle(result: FleetSweepResult) -> bool:
    """Whether every prefix row runs LRU and equals its oracle-affinity row (same hits, same QTTFT)."""
    key = ("num_instances", "policy", "capacity")
    ok = [r for r in result.rows if "error" not in r]
    ora = {tuple(r[k] for k in key): r for r in ok if r.get("router") == "oracle-affinity"}
    pre = [r for r in ok if r.get("router") == "prefix"]
    def same(r: dict[str, Any]) -> bool:
        o = ora.get(tuple(r[k] for k in key))
        return o is not None and o["hit_ratio"] == r["hit_ratio"] and o["qttft_mean_s"] == r["qttft_mean_s"]

    return bool(pre) and all(r["policy"] == "lru" and same(r) for r in pre)


def _table(result: FleetSweepResult, rows: list[dict[str, Any]]) -> Table:
    from tongyi_trace.sim.recommend import max_utilization

    tiers = [c for c in ("dram", "remote") if any(r[f"{c}_hit_ratio"] > 0 for r in rows)]
    t = Table(title="fleet simulation (capacity per instance)")
    cols = ("router", "inst", "policy", "capacity", "hit", *(f"{c} hit" for c in tiers), "QTTFT mean s",
            "p99 s", "max util", "imbal", "dup")
    for c in cols:
        t.add_column(c, justify="left" if c in ("router", "policy", "capacity") else "right")
    for r in rows:
        u = max_utilization(r)
        t.add_row(r["router"], str(r["num_instances"]), r["policy"], r["capacity"], f"{r['hit_ratio']:.4f}",
                  *(f"{r[f'{c}_hit_ratio']:.4f}" for c in tiers), f"{r['qttft_mean_s']:.3f}",
                  f"{r['qttft_p99_s']:.3f}", "-" if u is None else f"{u:.2f}", f"{r['imbalance']:.2f}",
                  f"{r['duplication']:.3f}")
    return t
