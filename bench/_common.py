"""Shared helpers of the benchmark scripts: the default synthetic traces, timing child processes."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / ".bench"
KVTRACE = [sys.executable, "-m", "tongyi_trace.cli"]


def kvtrace(*args: str) -> float:
    """Run `kvtrace ARGS` in a child process; return its wall time in seconds (raises on failure)."""
    t0 = time.perf_counter()
    subprocess.run([*KVTRACE, *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def timed_child(args: list[str]) -> tuple[float, float]:
    """Run ARGS as a child; return (wall seconds, the child's peak RSS in MiB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024


def synthetic_trace(profile: str = "to-c", scale: float = 1.0, seed: int = 1) -> Path:
    """The default synthetic trace of PROFILE (cached in .bench/)."""
    BENCH_DIR.mkdir(exist_ok=True)
    path = BENCH_DIR / f"{profile}-x{scale:g}-s{seed}.jsonl"
    if not path.exists():
        kvtrace("synth", "--profile", profile, "--seed", str(seed), "--scale", f"{scale:g}", "-o", str(path))
    return path


def ingested_run(profile: str = "to-c", scale: float = 1.0, seed: int = 1) -> Path:
    """The run folder of the default synthetic trace (ingested once, cached in .bench/)."""
    trace = synthetic_trace(profile, scale, seed)
    run = trace.with_suffix(".run")
    if not (run / "provenance.json").exists():
        kvtrace("ingest", str(trace), "-o", str(run), "-q")
    return run
