"""Speed of `kvtrace synth` at the default size (issue 2: under 30 s for ~43,000 requests, ~6 M refs).

For each profile: the end-to-end CLI in a child process (wall time, peak RSS) and, in this process,
the time of each phase (draw sessions + assemble block ids, write JSONL) and block refs/s.
No peer is named for this area; the floor printed beside it is json.dumps of the same records with the
standard library (what a naive writer would cost), to show what the hand-built lines save.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from _common import KVTRACE, timed_child

from tongyi_trace.trace.synth import generate
from tongyi_trace.trace.synth_core import write_jsonl

SEED = 1


def _json_dumps_floor(trace_path: Path) -> float:
    """Seconds to re-serialize the same records with json.dumps (parsing time excluded)."""
    recs = [json.loads(line) for line in trace_path.read_text().splitlines()]
    t0 = time.perf_counter()
    with open(trace_path.with_suffix(".floor"), "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    return time.perf_counter() - t0


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for profile in ("to-c", "to-b"):
            out = Path(tmp) / f"{profile}.jsonl"
            cpu0 = _children_cpu_s()
            wall, rss_mib = timed_child([*KVTRACE, "synth", "--profile", profile, "--seed", str(SEED),
                                         "-o", str(out), "--quiet"])
            cpu = _children_cpu_s() - cpu0
            t0 = time.perf_counter()
            trace = generate(profile, SEED)
            t1 = time.perf_counter()
            write_jsonl(trace, out)
            t2 = time.perf_counter()
            floor = _json_dumps_floor(out)
            print(f"{profile}: {trace.num_requests:,} requests, {trace.num_block_refs:,} block refs, "
                  f"{out.stat().st_size / 2**20:,.0f} MiB")
            print(f"  cli end-to-end  {wall:6.2f} s wall, {cpu:.2f} s CPU, peak RSS {rss_mib:,.0f} MiB "
                  f"(target < 30 s; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
            print(f"  draw+assemble   {t1 - t0:6.2f} s")
            print(f"  write jsonl     {t2 - t1:6.2f} s  ({trace.num_block_refs / (t2 - t0) / 1e6:.2f} M refs/s "
                  f"overall)")
            print(f"  json.dumps floor {floor:5.2f} s for the same lines (write / floor = "
                  f"{(t2 - t1) / floor:.2f})")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
