"""Benchmark of the cold compile of every numba kernel (issue 43 item 4): what `make install` pays once.

Runs scripts/compile_kernels.sh (the warm-up `make install` runs: a small pipeline through every compiled
path) against an EMPTY private numba cache (NUMBA_CACHE_DIR in a temporary folder: the tree's own caches
are untouched) with KVTRACE_COMPILE_LOG set, so that every process, an executor's workers included, logs
each kernel compile (tongyi_trace/compile_notice.py: a kernel's own seconds, those of a kernel compiled
inside it counted apart). Prints the CPU seconds per kernel (the compiling thread's, so a shared machine's
load inflates them little; summed over its specializations, largest first) and its wall seconds, the
number of specializations, the compile seconds in total (summed over the processes), the CPU seconds of
the script's steps (the setup, then the two processes side by side: on an idle 2-core machine the wall is
about the setup's plus the larger of the two) and the script's wall and CPU time with the load average.
Target: the script's wall <= 60 s on this project's idle 2-core machine (tongyi_trace/compile_notice.py's
COLD_COMPILE_S says what the first run's notice announces).

    .venv/bin/python bench/bench_compile.py [--top N] [--cache-dir EMPTY_DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from _common import REPO

TARGET_S = 60.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=25, help="kernels listed (the rest are summed)")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="an empty or new folder to compile into and keep (default: a temporary one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-compile-") as tmp:
        cache = args.cache_dir or Path(tmp) / "numba"
        if cache.exists() and any(cache.iterdir()):
            sys.exit(f"--cache-dir {cache}: not empty (the compile must start cold)")
        log = Path(tmp) / "compiles.jsonl"
        env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "KVTRACE_COMPILE_LOG": str(log),
               "PYTHONPATH": str(REPO), "KVTRACE": f"{sys.executable} -m tongyi_trace.cli", "PYTHON": sys.executable}
        t0 = time.perf_counter()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(["bash", str(REPO / "scripts" / "compile_kernels.sh")], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        wall_s = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        script_cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    rows = [r for r in lines if "kernel" in r]
    steps = [r for r in lines if "branch" in r]  # the script's steps: their CPU and when they ended
    cpu: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for r in rows:
        cpu[r["kernel"]] += r["cpu_s"]
        wall[r["kernel"]] += r["wall_s"]
        count[r["kernel"]] += 1
    total_s = sum(cpu.values())
    ranked = sorted(cpu, key=lambda k: -cpu[k])
    print(f"{'kernel':<58} {'specializations':>15} {'cpu s':>7} {'wall s':>7}")
    for k in ranked[:args.top]:
        print(f"{k.removeprefix('tongyi_trace.'):<58} {count[k]:>15} {cpu[k]:>7.1f} {wall[k]:>7.1f}")
    rest = ranked[args.top:]
    if rest:
        print(f"{f'({len(rest)} more kernels)':<58} {sum(count[k] for k in rest):>15} "
              f"{sum(cpu[k] for k in rest):>7.1f} {sum(wall[k] for k in rest):>7.1f}")
    print(f"kernels: {len(cpu)}, specializations: {len(rows)}, processes: {len({r['pid'] for r in rows})}")
    step_s = {st["branch"]: _times_s(st["times"]) for st in steps}
    for st in steps:  # the setup (synth, ingest), then the two processes side by side
        print(f"step {st['branch']:<7} CPU {step_s[st['branch']]:6.1f} s (user + sys of its commands), "
              f"ended at {st['end_s']} s")
    print(f"cold compile, CPU seconds summed over processes: {total_s:.1f} s; wall seconds summed: "
          f"{sum(wall.values()):.1f} s (inflated by a loaded machine)")
    print(f"compile_kernels.sh wall: {wall_s:.1f} s (load average then: {os.getloadavg()[0]:.1f}), CPU "
          f"{script_cpu_s:.1f} s in all")
    if step_s:  # what the wall is on an idle 2-core machine: the setup, then the longer of the two processes
        idle_s = step_s.get("setup", 0.0) + max(step_s.get("first", 0.0), step_s.get("second", 0.0))
        print(f"wall on an idle 2-core machine, from the steps' CPU: about {idle_s:.0f} s (target <= "
              f"{TARGET_S:.0f} s: {'met' if idle_s <= TARGET_S else 'NOT met'})")


def _times_s(times: str) -> float:
    """Seconds of bash's `times` line "1m2.345s 0m0.678s" (user, sys), summed."""
    total = 0.0
    for part in times.split():
        m, _, sec = part.rstrip("s").partition("m")
        total += 60 * float(m) + float(sec)
    return total


if __name__ == "__main__":
    main()
