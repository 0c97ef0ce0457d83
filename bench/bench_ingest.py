"""Ingest speed and memory on the default to-C synthetic trace, against the parsing floor.

Prints wall time, block references per second and peak RSS of `kvtrace ingest`, and the ratio to
merely parsing the same JSONL with the fastest reader available here (the floor: the faster of
Polars' NDJSON reader and an orjson line loop), each in a child process of its own.
"""

from __future__ import annotations

import json
import sys
import tempfile

from _common import KVTRACE, synthetic_trace, timed_child

FLOOR_POLARS = "import polars as pl, sys; pl.read_ndjson(sys.argv[1])"
FLOOR_ORJSON = ("import orjson, sys\n"
                "n = 0\n"
                "with open(sys.argv[1], 'rb') as f:\n"
                "    for line in f: n += len(orjson.loads(line)['hash_ids'])\n")


def main() -> None:
    trace = synthetic_trace("to-c")
    with tempfile.TemporaryDirectory() as tmp:
        wall, rss = timed_child([*KVTRACE, "ingest", str(trace), "-o", tmp, "-q"])
        prov = json.loads((__import__("pathlib").Path(tmp) / "provenance.json").read_text())
    refs = prov["num_block_refs"]
    floors = {name: timed_child([sys.executable, "-c", code, str(trace)])[0]
              for name, code in (("polars.read_ndjson", FLOOR_POLARS), ("orjson loop", FLOOR_ORJSON))}
    floor_name = min(floors, key=floors.__getitem__)
    print(f"ingest {trace.name}: {prov['num_requests']:,} requests, {refs:,} block refs")
    print(f"  wall {wall:.2f} s, {refs / wall / 1e6:.2f} M refs/s, peak RSS {rss:,.0f} MiB")
    for name, t in floors.items():
        print(f"  parse floor {name}: {t:.2f} s")
    print(f"  ingest / floor ({floor_name}) = {wall / floors[floor_name]:.2f}x")


if __name__ == "__main__":
    main()
