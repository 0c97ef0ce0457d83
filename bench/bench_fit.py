"""Benchmark of `kvtrace fit` (issue 4): fit time on the default to-C synthetic trace (target < 10 s).

The trace is `kvtrace synth --profile to-c` (seed 0: 43,000 requests over 2 h), ingested once and
cached by bench/_common.py in .bench/. Prints the time of each phase
(linking accesses, whole fit with and without a held-out window) as the best of 3 runs.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import ingested_run

from tongyi_trace.fit.events import load_accesses
from tongyi_trace.fit.policy_fit import fit_policy
from tongyi_trace.run import open_run

TARGET_S = 10.0
REPEATS = 3


def best_of(fn: Callable[[], object], repeats: int = REPEATS) -> tuple[float, float]:
    """Smallest wall time and smallest CPU time (this process, all threads) of REPEATS calls of FN."""
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return min(walls), min(cpus)


def main() -> None:
    run = ingested_run("to-c")
    prov = open_run(run).provenance()
    print(f"trace: {prov['num_requests']:,} requests, {prov['num_block_refs']:,} block refs, "
          f"{prov['num_distinct_blocks']:,} distinct blocks, {prov['duration_s']:.0f} s")
    out = Path(tempfile.gettempdir()) / "kvtrace-bench" / "policy.json"
    link_s, link_cpu = best_of(lambda: load_accesses(open_run(run).tables()))
    fit_s, fit_cpu = best_of(lambda: fit_policy(run, out))
    split_s, split_cpu = best_of(lambda: fit_policy(run, out, train="0:3600", test="3600:"))
    print("wall time (CPU time of this process in brackets: wall >> CPU means a busy machine)")
    print(f"link accesses (sort + next access): {link_s:.2f} s [{link_cpu:.2f} s]")
    print(f"fit, whole trace:                   {fit_s:.2f} s [{fit_cpu:.2f} s]  (target < {TARGET_S:.0f} s: "
          f"{'met' if fit_s < TARGET_S else 'MISSED'})")
    print(f"fit, --train 0:3600 --test 3600:    {split_s:.2f} s [{split_cpu:.2f} s]")
    print(f"throughput: {prov['num_block_refs'] / fit_s / 1e6:.2f} M block refs/s")


if __name__ == "__main__":
    main()
