"""Benchmark of `kvtrace analyze --executor ray`: the default to-C synthetic trace analyzed locally and with the
per-chain work in 8 and 16 partitions on a local 2-CPU Ray cluster (`ray start --head`, connected by
address): wall time and the driver's peak memory of each, one partition task's time and peak memory in a
fresh process (what a Ray worker needs), and whether every artifact equals the local one (to the bit).
--scale 10 for the 10x trace.

    .venv/bin/python bench/bench_analyze_ray.py [--scale 10]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl
from _common import BENCH_DIR, KVTRACE, ingested_run, timed_child
from bench_ray import ray_cluster

PARTITIONS = (8, 16)


def copy_run(src: Path, name: str) -> Path:
    """A fresh run folder NAME with SRC's tables."""
    dst = BENCH_DIR / name
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for f in ("provenance.json", "requests.parquet", "blocks.parquet"):
        shutil.copy(src / f, dst / f)
    return dst


def _same_json(a: Any, b: Any) -> bool:
    """A equals B exactly (floats to the bit), but for the measured timings and the run's path."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(k in ("elapsed_s", "run") or _same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def compare(local: Path, other: Path) -> list[str]:
    """The files (file:column for tables) of OTHER/analysis that differ from LOCAL's."""
    bad: list[str] = []
    for a in sorted((local / "analysis").iterdir()):
        b = other / "analysis" / a.name
        if a.name == "manifest.json":
            continue
        if not b.exists():
            bad.append(a.name)
        elif a.suffix == ".json":
            if not _same_json(json.loads(a.read_text()), json.loads(b.read_text())):
                bad.append(a.name)
        else:
            x, y = pl.read_parquet(a), pl.read_parquet(b)
            if x.schema != y.schema or x.height != y.height:
                bad.append(a.name)
                continue
            bad += [f"{a.name}:{c}" for c in x.columns if not x[c].equals(y[c])]
    return bad


def probe(run: Path, num_partitions: int) -> None:
    """In this fresh process: one partition task of RUN; prints its seconds and peak memory above the imports."""
    from tongyi_trace.analysis import ANALYSES, AnalysisOptions
    from tongyi_trace.analysis.common import open_context
    from tongyi_trace.analysis.partitioned import partition_queries, partition_task
    from tongyi_trace.run import open_run

    tables = open_run(run).tables()
    opts = AnalysisOptions()
    with open_context(tables, opts) as ctx:
        queries = partition_queries(ctx, list(ANALYSES))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    partition_task(0, {"tables": tables, "options": opts, "num_partitions": num_partitions, "queries": queries})
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": wall, "process_mib": peak / 1024, "above_imports_mib": (peak - base) / 1024}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="Scale of the to-C trace (10: the 10x trace).")
    ap.add_argument("--probe", nargs=2, metavar=("RUN", "PARTITIONS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        probe(Path(args.probe[0]), int(args.probe[1]))
        return
    src = ingested_run("to-c", args.scale)
    refs = json.loads((src / "provenance.json").read_text())["num_block_refs"]
    print(f"analyze, to-C trace x{args.scale:g} ({refs:,} block references), 2 cores:")
    local = copy_run(src, "analyze-local.run")
    wall, peak = timed_child([*KVTRACE, "analyze", str(local), "-q"])
    print(f"  local:                 {wall:6.1f} s, peak {peak:6.0f} MiB")
    with ray_cluster() as address:
        for n in PARTITIONS:
            run = copy_run(src, f"analyze-ray{n}.run")
            wall, peak = timed_child([*KVTRACE, "analyze", str(run), "--executor", "ray", "--ray-address", address,
                                      "--partitions", str(n), "-q"])
            bad = compare(local, run)
            same = "every artifact equal to the bit" if not bad else f"DIFFERS: {', '.join(bad[:5])}"
            print(f"  ray, {n:2} partitions:    {wall:6.1f} s, driver peak {peak:6.0f} MiB; {same}")
            shutil.rmtree(run, ignore_errors=True)
    for n in PARTITIONS:
        out = json.loads(subprocess.run([sys.executable, __file__, "--probe", str(src), str(n)], check=True,
                                        capture_output=True, text=True).stdout)
        print(f"  one task of {n:2} partitions: {out['seconds']:5.1f} s, +{out['above_imports_mib']:5.0f} MiB above "
              f"a worker's imports (process {out['process_mib']:.0f} MiB)")
    shutil.rmtree(local, ignore_errors=True)


if __name__ == "__main__":
    main()
