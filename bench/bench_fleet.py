"""Benchmark of the fleet simulator (`kvtrace simulate --instances --router`) on the default synthetic traces.

1. Speed: the default to-C trace, 5 routers (rr, least-loaded, session, prefix, kv-aware) x {2, 4, 8}
   instances x 3 capacities per instance with LRU, on all cores. Target (issue 15): < 90 s on 2 cores.
   Also printed: the CPU seconds of this process and its workers (the wall time on a shared machine
   depends on what else runs; CPU / cores is what an idle machine of those cores would take).
2. The table a reader wants before choosing a router: for the to-C and to-B profiles, hit ratio and P99
   QTTFT by router x instances at a fixed total cache (TOTAL split evenly over the instances; the
   oracle-affinity row is the per-request bound), model qwen2-7b's cost model.

    .venv/bin/python bench/bench_fleet.py [--total 10%] [--skip-speed] [--profiles to-c,to-b]
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from dataclasses import replace
from pathlib import Path

from _common import ingested_run

from tongyi_trace.fleet.sweep import FleetOptions, run_fleet_sweep
from tongyi_trace.run import open_run
from tongyi_trace.sim.capacity import parse_capacities
from tongyi_trace.sim.stream import load_stream
from tongyi_trace.sim.sweep import SimulateOptions, build_config

ROUTERS = "rr,least-loaded,session,prefix,kv-aware"
COUNTS = (2, 4, 8)
SPEED_CAPACITIES = "1%,2%,5%"


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process and its finished children."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def speed(run: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of the 45-configuration LRU sweep."""
    cfg = build_config(SimulateOptions(policies="lru", capacities=SPEED_CAPACITIES))
    t0, c0 = time.perf_counter(), _cpu_s()
    res = run_fleet_sweep(open_run(run), replace(cfg, write=False),
                          FleetOptions(",".join(map(str, COUNTS)), ROUTERS))
    wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
    assert len(res.rows) == 45 and not res.summary["failed"], res.summary["failed"]
    return wall, cpu


def table(profile: str, total: str) -> None:
    """Hit ratio and P99 QTTFT by router x instances at a fixed total cache."""
    run = open_run(ingested_run(profile))
    stream = load_stream(run.tables())
    total_blocks = parse_capacities(total, num_distinct=stream.num_ids, block_size_tokens=stream.block_size,
                                    model=None)[0].num_blocks
    cells: dict[tuple[str, int], dict] = {}
    t0 = time.perf_counter()
    for n in COUNTS:
        cfg = build_config(SimulateOptions(policies="lru", capacities=str(total_blocks // n)))
        res = run_fleet_sweep(run, replace(cfg, write=False),
                              FleetOptions(str(n), ROUTERS + ",oracle-affinity"))
        cells.update({(r["router"], n): r for r in res.rows})
    print(f"\n{profile}: {stream.num_requests:,} requests, total cache {total} = {total_blocks:,} blocks "
          f"(LRU; ideal hit ratio {stream.ideal_hits() / stream.num_refs:.4f}; {time.perf_counter() - t0:.0f} s)")
    head = "router".ljust(16) + "".join(f"{f'{n} inst hit':>13}{'P99 s':>10}{'imbal':>7}" for n in COUNTS)
    print(head)
    for rt in [*ROUTERS.split(","), "oracle-affinity"]:
        line = rt.ljust(16)
        for n in COUNTS:
            r = cells[(rt, n)]
            line += f"{r['hit_ratio']:>13.4f}{r['qttft_p99_s']:>10.2f}{r['imbalance']:>7.2f}"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--total", default="10%", help="Fixed total cache of the router table (capacity units).")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--profiles", default="to-c,to-b", help="Profiles of the router table (empty: none).")
    args = ap.parse_args()
    if not args.skip_speed:
        wall, cpu = speed(ingested_run("to-c"))
        cores = os.cpu_count() or 1
        print(f"fleet sweep, to-C default trace, 5 routers x {{2,4,8}} instances x 3 capacities, LRU: "
              f"{wall:.1f} s (target < 90 s on 2 cores) {'OK' if wall < 90 else 'SLOWER THAN TARGET'}; "
              f"CPU {cpu:.1f} s = {cpu / cores:.1f} s on {cores} cores; load average {os.getloadavg()[0]:.1f}")
    for profile in [p for p in args.profiles.split(",") if p]:
        table(profile, args.total)


if __name__ == "__main__":
    main()
