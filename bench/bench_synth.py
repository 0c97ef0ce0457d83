"""Speed of `kvtrace synth` at the default size (issue 2: under 30 s for ~43,000 requests, ~6 M refs).

For each profile: the end-to-end CLI in a child process (wall time, peak RSS) and, in this process,
the wall and CPU time of each phase (draw sessions + assemble block ids, write JSONL) and block refs/s
(CPU times matter when the machine is shared: the load average is printed). No peer is named for this
area; the floor printed beside the writer is json.dumps of the same records, already built as dicts,
with the standard library: the cost of serializing alone.
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
    """CPU seconds to re-serialize the same records with json.dumps (parsing time excluded)."""
    recs = [json.loads(line) for line in trace_path.read_text().splitlines()]
    t0 = time.process_time()
    with open(trace_path.with_suffix(".floor"), "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    return time.process_time() - t0


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
            t0, c0 = time.perf_counter(), time.process_time()
            trace = generate(profile, SEED)
            t1, c1 = time.perf_counter(), time.process_time()
            write_jsonl(trace, out)
            t2, c2 = time.perf_counter(), time.process_time()
            floor = _json_dumps_floor(out)
            print(f"{profile}: {trace.num_requests:,} requests, {trace.num_block_refs:,} block refs, "
                  f"{out.stat().st_size / 2**20:,.0f} MiB")
            print(f"  cli end-to-end  {wall:6.2f} s wall, {cpu:.2f} s CPU, peak RSS {rss_mib:,.0f} MiB "
                  f"(target < 30 s; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
            print(f"  draw+assemble   {t1 - t0:6.2f} s wall, {c1 - c0:.2f} s CPU")
            print(f"  write jsonl     {t2 - t1:6.2f} s wall, {c2 - c1:.2f} s CPU "
                  f"({trace.num_block_refs / (c2 - c0) / 1e6:.2f} M refs per CPU second overall)")
            print(f"  json.dumps floor {floor:5.2f} s CPU for the same lines (write / floor = "
                  f"{(c2 - c1) / floor:.2f})")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
