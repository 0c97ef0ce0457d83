"""Benchmark of the cold compile of every numba kernel (issue 43 item 4): what `make install` pays once.

Runs scripts/compile_kernels.sh (the warm-up `make install` runs: a small pipeline through every compiled
path) against an EMPTY private numba cache (NUMBA_CACHE_DIR in a temporary folder: the tree's own caches
are untouched) with KVTRACE_COMPILE_LOG set, so that every process logs each kernel compile
(tongyi_trace/compile_notice.py: a kernel's own seconds, those of a kernel compiled inside it counted
apart). Prints the CPU seconds per kernel (the compiling thread's, so a shared machine's load does not
inflate them; summed over its specializations, largest first) and its wall seconds, the number of
specializations, the compile seconds in total (summed over the processes) and the script's wall time.
Target: total compile <= 60 s on this project's 2-core machine (tongyi_trace/compile_notice.py's
COLD_COMPILE_S says what the first run's notice announces).

    .venv/bin/python bench/bench_compile.py [--top N] [--cache-dir EMPTY_DIR]
"""

from __future__ import annotations

import argparse
import json
import os
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
        subprocess.run(["bash", str(REPO / "scripts" / "compile_kernels.sh")], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        wall_s = time.perf_counter() - t0
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
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
    print(f"cold compile, CPU seconds summed over processes: {total_s:.1f} s (target <= {TARGET_S:.0f} s: "
          f"{'met' if total_s <= TARGET_S else 'NOT met'}); wall seconds summed: {sum(wall.values()):.1f} s "
          f"(inflated by a loaded machine); compile_kernels.sh wall: {wall_s:.1f} s")


if __name__ == "__main__":
    main()
