"""Ingest speed and memory on the default to-C synthetic trace, against the parsing floor.

Prints wall time, block references per second and peak RSS of `kvtrace ingest`, and the ratio to
merely parsing the same JSONL with the fastest reader available here (the floor: the faster of
Polars' NDJSON reader and an orjson line loop), each in a child process of its own, in the same run.
Target: ingest <= 4x the floor, peak RSS no higher than before (977 MB). The CPU-time ratio is printed
too: on shared cores the wall ratio is inflated by waiting. It also prints what this ingest spends before
parsing a byte (Python's and ingest's imports, loading the compiled JSONL scan, writing the blocks table)
and a warm ingest (a second one in the same process), both against the floor. Then the scaling: the same
profile at 4x the size (several chunks: the chain ids' numbering must stay linear across them), CPU time
against the x1's. Last, the same x1 trace with its block ids replaced by 63-bit hashes: ingest then
numbers chains by their chain ids (trace/dense.ChainNumbers leaves its direct mode), the path of a trace
whose ids are content hashes.

    .venv/bin/python bench/bench_ingest.py
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
from _common import KVTRACE, synthetic_trace, timed_child

from tongyi_trace.trace.records import CHUNK_REFS

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


def hashed_ids_trace(trace: Path) -> Path:
    """TRACE with every block id replaced by a 63-bit hash of it (a bijection: the same reuse), cached beside it."""
    out = trace.with_suffix(".hashed-ids.jsonl")
    if not out.exists():
        mask = (1 << 63) - 1
        with trace.open("rb") as f, out.open("wb") as o:
            for line in f:
                rec = orjson.loads(line)
                rec["hash_ids"] = [(h * 0x9E3779B97F4A7C15 + 12345) & mask for h in rec["hash_ids"]]
                o.write(orjson.dumps(rec) + b"\n")
    return out


IMPORTS = "import tongyi_trace.cli.ingest, tongyi_trace.trace.ingest"
LOAD_SCAN = ("import time, numpy as np, tongyi_trace.cli.ingest, tongyi_trace.trace.ingest\n"
             "t0 = time.perf_counter()\n"
             "from tongyi_trace.trace import jsonl_scan as js\n"
             "rec, ts, ids = np.zeros((1, js.REC_COLS), np.int64), np.zeros(1), np.zeros(1, np.int64)\n"
             "js.scan(np.frombuffer(b'\\n', np.uint8), 0, 1, True, 1, 1, rec, ts, ids, 1.0, 1, 1)\n"
             "print(time.perf_counter() - t0)\n")
WARM = ("import sys, tempfile, time\n"
        "from tongyi_trace.trace.ingest import ingest_trace\n"
        "with tempfile.TemporaryDirectory() as d:\n"
        "    ingest_trace(sys.argv[1], d + '/first')\n"
        "    t0 = time.perf_counter()\n"
        "    ingest_trace(sys.argv[1], d + '/second')\n"
        "    print(time.perf_counter() - t0)\n")
WRITE_BLOCKS = ("import sys, time, pyarrow.parquet as pq\n"
                "from tongyi_trace.trace.ingest import BLOCKS_WRITE_OPTIONS\n"
                "table = pq.read_table(sys.argv[1])\n"
                "t0 = time.perf_counter()\n"
                "pq.write_table(table, sys.argv[2], **BLOCKS_WRITE_OPTIONS)\n"
                "print(time.perf_counter() - t0)\n")


def _printed_s(code: str, *args: str) -> float:
    """The seconds CODE, run as a child with ARGS, prints."""
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True)
    return float(out.stdout)


def _least_work(run: Path) -> tuple[float, float, float]:
    """(wall s of starting Python and importing what ingest imports, s of loading the compiled JSONL scan
    (numba's start-up, the scan itself from its cache), s of writing RUN's blocks table in ingest's encoding
    from memory): what this ingest spends here before parsing a byte."""
    imports, _ = timed_child([sys.executable, "-c", IMPORTS])
    return (imports, _printed_s(LOAD_SCAN),
            _printed_s(WRITE_BLOCKS, str(run / "blocks.parquet"), str(run / "rewritten.parquet")))


def main() -> None:
    trace = synthetic_trace("to-c")
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu, rss = _timed([*KVTRACE, "ingest", str(trace), "-o", tmp, "-q"])
        prov = json.loads((Path(tmp) / "provenance.json").read_text())
        imports_s, scan_s, write_s = _least_work(Path(tmp))
    warm_s = _printed_s(WARM, str(trace))
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
    print(f"  before any parsing: Python and ingest's imports {imports_s:.2f} s + loading the compiled scan "
          f"{scan_s:.2f} s + writing blocks.parquet ({refs:,} rows, 6 columns) {write_s:.2f} s = "
          f"{(imports_s + scan_s + write_s) / fw:.2f}x the floor")
    print(f"  warm (a second ingest in the same process: no start-up, the memory already mapped): "
          f"{warm_s:.2f} s = {warm_s / fw:.2f}x the floor")
    big = synthetic_trace("to-c", 4.0)
    with tempfile.TemporaryDirectory() as tmp:
        _, cpu4, rss4 = _timed([*KVTRACE, "ingest", str(big), "-o", tmp, "-q"])
        refs4 = json.loads((Path(tmp) / "provenance.json").read_text())["num_block_refs"]
    print(f"  scaling: {big.name} ({refs4:,} refs, {-(-refs4 // CHUNK_REFS)} chunks): CPU {cpu4:.2f} s = "
          f"{cpu4 / cpu:.2f}x the x1 trace's for {refs4 / refs:.2f}x its refs; peak RSS {rss4:,.0f} MiB")
    with tempfile.TemporaryDirectory() as tmp:
        wall_h, cpu_h, rss_h = _timed([*KVTRACE, "ingest", str(hashed_ids_trace(trace)), "-o", tmp, "-q"])
    print(f"  hashed block ids (chains numbered by chain id): wall {wall_h:.2f} s, CPU {cpu_h:.2f} s "
          f"({cpu_h / cpu:.2f}x the x1's CPU), peak RSS {rss_h:,.0f} MiB")


if __name__ == "__main__":
    main()
