"""Shared helpers of the benchmark scripts: the default synthetic traces, timing child processes, running
one under a ceiling on its resident memory (bench/bench_scale.py, tests/hardening/test_memory_ceiling.py)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / ".bench"
KVTRACE = [sys.executable, "-m", "tongyi_trace.cli"]
GB = 1e9
POLL_S = 0.05


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


@dataclass
class Measured:
    """One child's wall time, the peak resident memory of its process tree, and how it ended."""

    wall_s: float
    peak_bytes: int
    code: int
    killed: bool
    stderr: str


def tree_rss_bytes(proc: psutil.Process) -> int:
    """Resident memory of PROC and its children now (0 for those that are gone)."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def _exit_on_term(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def run_capped(args: list[str], ceiling_bytes: int, stdout: Path | None = None) -> Measured:
    """Run ARGS as a child (its stdout into the file STDOUT, or dropped), polling its tree's resident memory;
    kill the tree past CEILING_BYTES."""
    t0 = time.perf_counter()
    out = stdout.open("w") if stdout else subprocess.DEVNULL
    in_main = threading.current_thread() is threading.main_thread()  # where a handler may be set
    previous = signal.signal(signal.SIGTERM, _exit_on_term) if in_main else None  # a bench killed kills its child
    child = subprocess.Popen(args, stdout=out, stderr=subprocess.PIPE, text=True)
    proc = psutil.Process(child.pid)
    peak, killed = 0, False
    try:
        while child.poll() is None:
            rss = tree_rss_bytes(proc)
            peak = max(peak, rss)
            if rss > ceiling_bytes:
                killed = True
                break
            time.sleep(POLL_S)
    finally:  # past the ceiling, or the caller stopped (a test's timeout): no child is left running
        if child.poll() is None:
            for p in [*proc.children(recursive=True), proc]:
                with contextlib.suppress(psutil.Error):
                    p.kill()
        if in_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    _, err = child.communicate()
    if not isinstance(out, int):
        out.close()
    return Measured(time.perf_counter() - t0, peak, child.returncode, killed, (err or "").strip())


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
