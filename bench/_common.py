"""Shared helpers of the benchmark scripts: the default synthetic traces, timing child processes."""

from __future__ import annotations

import hashlib
import os
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
    """Run ARGS as a child; return (wall seconds, that child's own peak RSS in MiB: its wait4 accounting, not
    the largest of every child so far)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code:
        raise subprocess.CalledProcessError(code, args)
    return wall, usage.ru_maxrss / 1024


def _generator_digest() -> str:
    """Digest of the sources that shape a synthetic run, so a cached one is rebuilt when they change."""
    h = hashlib.sha256()
    for src in sorted((REPO / "tongyi_trace" / "trace").glob("*.py")):
        h.update(src.read_bytes())
    return h.hexdigest()[:10]


def synthetic_trace(profile: str = "to-c", scale: float = 1.0, seed: int = 0) -> Path:
    """The default synthetic trace of PROFILE (`kvtrace synth` defaults: seed 0), cached in .bench/."""
    BENCH_DIR.mkdir(exist_ok=True)
    path = BENCH_DIR / f"{profile}-x{scale:g}-s{seed}-{_generator_digest()}.jsonl"
    if not path.exists():
        kvtrace("synth", "--profile", profile, "--seed", str(seed), "--scale", f"{scale:g}", "-o", str(path))
    return path


def ingested_run(profile: str = "to-c", scale: float = 1.0, seed: int = 0) -> Path:
    """The run folder of the default synthetic trace (ingested once, cached in .bench/)."""
    trace = synthetic_trace(profile, scale, seed)
    run = trace.with_suffix(".run")
    if not (run / "provenance.json").exists():
        kvtrace("ingest", str(trace), "-o", str(run), "-q")
    return run


def fitted_policy(run: Path) -> Path:
    """RUN's policy file from `kvtrace fit` over the whole trace (made once, kept beside the run)."""
    policy = run.with_suffix(".policy.json")
    if not policy.exists():
        kvtrace("fit", str(run), "-o", str(policy), "-q")
    return policy
