"""`kvtrace synth`: speed of every profile at its default size, and the calibration band table.

Speed (issue: to-C < 15 s, to-B < 20 s, coder < 30 s on 2 cores): the end-to-end CLI in a child
process (wall time, peak RSS) and, in this process, draw + assemble vs writing the JSONL (CPU times
matter when the machine is shared: the load average is printed).
Bands (the slow check): `kvtrace synth --profile P --check` for to-C and to-B seeds 1-3 and thinking
and coder seed 1, at full size, through the real ingest, analyses and LRU curve.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from _common import KVTRACE, timed_child

from tongyi_trace.calibration.profiles import check_profile
from tongyi_trace.trace.synth import PROFILES, generate
from tongyi_trace.trace.synth_core import write_jsonl

SEED = 1
TARGET_S = {"to-c": 15, "to-b": 20, "thinking": 15, "coder": 30}
BAND_RUNS = [("to-c", 1), ("to-c", 2), ("to-c", 3), ("to-b", 1), ("to-b", 2), ("to-b", 3), ("thinking", 1),
             ("coder", 1)]


def speed(tmp: Path) -> None:
    for profile in PROFILES:
        out = tmp / f"{profile}.jsonl"
        wall, rss_mib = timed_child([*KVTRACE, "synth", "--profile", profile, "--seed", str(SEED),
                                     "-o", str(out), "--quiet"])
        c0 = time.process_time()
        trace = generate(profile, SEED)
        c1 = time.process_time()
        write_jsonl(trace, out)
        c2 = time.process_time()
        print(f"{profile}: {trace.num_requests:,} requests, {trace.num_block_refs:,} block refs; cli "
              f"{wall:.2f} s wall (target < {TARGET_S[profile]} s), peak RSS {rss_mib:,.0f} MiB; draw+assemble "
              f"{c1 - c0:.2f} s CPU, write {c2 - c1:.2f} s CPU (load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores)", flush=True)
        out.unlink()


def bands(tmp: Path) -> None:
    for profile, seed in BAND_RUNS:
        rows = check_profile(profile, seed, work_dir=tmp)
        print(f"\n{profile} seed {seed}: {sum(r.ok is True for r in rows)} of "
              f"{sum(r.ok is not None for r in rows)} bands hold")
        for r in rows:
            mark = "-" if r.ok is None else "pass" if r.ok else "FAIL"
            value = "-" if r.value is None else f"{r.value:,.3f}"
            print(f"  {r.label:45s} {value:>14} {r.lo:>10,.3g} - {r.hi:<10,.3g} {mark}", flush=True)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        speed(Path(tmp))
        bands(Path(tmp))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
