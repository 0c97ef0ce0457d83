"""What the intervals cost: `kvtrace simulate` of the default 6 policies x 6 capacities on the default to-C
trace, with its intervals (the paired session bootstrap of tongyi_trace/sim/bootstrap.py: every gain over LRU,
QTTFT change and target size) and with --no-intervals. Each is timed as a child process, alternately,
best of REPEATS (the machine may be shared); the interval step's own time (summary `intervals.elapsed_s`)
is printed beside it. Target (issue 39): the intervals add <= 30% to the sweep.

    .venv/bin/python bench/bench_intervals.py [--run RUN_DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

from _common import KVTRACE, ingested_run

REPEATS = 2
TARGET_EXTRA = 0.30


def sweep(run: Path, *extra: str) -> tuple[float, dict]:
    """`kvtrace simulate RUN --json EXTRA` (default policies and capacities): (wall seconds, its summary)."""
    t0 = time.perf_counter()
    out = subprocess.run([*KVTRACE, "simulate", str(run), "--json", *extra], check=True, capture_output=True,
                         text=True).stdout
    return time.perf_counter() - t0, json.loads(out)["summary"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="an ingested run folder (default: the to-C synthetic trace)")
    args = ap.parse_args()
    run = args.run or ingested_run("to-c", 1.0)
    sweep(run, "--no-intervals", "-c", "1%")  # compile and warm the caches once, untimed
    walls: dict[str, list[float]] = {"with": [], "without": []}
    summary: dict = {}
    for _ in range(REPEATS):
        wall, summary = sweep(run)
        walls["with"].append(wall)
        walls["without"].append(sweep(run, "--no-intervals")[0])
    iv = summary["intervals"]
    with_s, without_s = min(walls["with"]), min(walls["without"])
    extra = with_s / without_s - 1
    print(f"kvtrace simulate {run.name}: {len(summary['policies'])} policies x {len(summary['capacities'])} "
          f"capacities, {summary['num_refs']:,} refs, {summary['num_requests']:,} requests")
    print(f"  without intervals {without_s:6.1f} s   with intervals {with_s:6.1f} s   (best of {REPEATS}: "
          f"{', '.join(f'{w:.1f}' for w in walls['without'])} / {', '.join(f'{w:.1f}' for w in walls['with'])})")
    print(f"  interval step {iv['elapsed_s']:.2f} s: {iv['num_resamples']:,} resamples of {iv['num_groups']:,} "
          f"{iv['resampled']} at {100 * iv['confidence']:g}%")
    print(f"  intervals add {100 * extra:+.1f}% to the sweep -> target <= {100 * TARGET_EXTRA:.0f}% "
          f"{'met' if extra <= TARGET_EXTRA else 'NOT met'}")


if __name__ == "__main__":
    main()
