"""Ingest speed and memory on the default to-C synthetic trace, against the parsing floor.

Prints wall time, block references per second and peak RSS of `kvtrace ingest`, and the ratio to
merely parsing the same JSONL with the fastest reader available here (the floor: the faster of
Polars' NDJSON reader and an orjson line loop), each in a child process of its own, in the same run.
Target: ingest <= 4x the floor, peak RSS no higher than before (977 MB). The CPU-time ratio is printed
too: on shared cores the wall ratio is inflated by waiting.

    .venv/bin/python bench/bench_ingest.py
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
from pathlib import Path

from _common import KVTRACE, synthetic_trace, timed_child

FLOOR_POLARS = "import polars as pl, sys; pl.read_ndjson(sys.argv[1])"
FLOOR_ORJSON = ("import orjson, sys\n"
                "n = 0\n"
                "with open(sys.argv[1], 'rb') as f:\n"
                "    for line in f: n += len(orjson.loads(line)['hash_ids'])\n")


def _timed(args: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s (user + sys), peak RSS MiB) of ARGS run as a child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, rss = timed_child(args)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, rss


def main() -> None:
    trace = synthetic_trace("to-c")
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu, rss = _timed([*KVTRACE, "ingest", str(trace), "-o", tmp, "-q"])
        prov = json.loads((Path(tmp) / "provenance.json").read_text())
    refs = prov["num_block_refs"]
    floors = {name: _timed([sys.executable, "-c", code, str(trace)])
              for name, code in (("polars.read_ndjson", FLOOR_POLARS), ("orjson loop", FLOOR_ORJSON))}
    floor_name = min(floors, key=lambda n: floors[n][0])
    print(f"ingest {trace.name}: {prov['num_requests']:,} requests, {refs:,} block refs")
    print(f"  wall {wall:.2f} s, CPU {cpu:.2f} s, {refs / wall / 1e6:.2f} M refs/s, peak RSS {rss:,.0f} MiB")
    for name, (t, c, _) in floors.items():
        print(f"  parse floor {name}: wall {t:.2f} s, CPU {c:.2f} s")
    fw, fc, _ = floors[floor_name]
    print(f"  ingest / floor ({floor_name}) = {wall / fw:.2f}x wall, {cpu / fc:.2f}x CPU "
          f"(target <= 4x; load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
