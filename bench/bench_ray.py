"""Benchmark of the Ray executor: the 7-policy x 8-capacity sweep on the default to-C synthetic trace, local
process pool vs a local Ray cluster (`ray start --head --num-cpus 2`, connected by address), same machine;
then per-task time and memory (one simulation in a fresh process) at the default scale and, with
--scale-10x, at 10x, for docs/scale-out.md's projection. Target (issue 17): Ray within 1.3x of the local
executor's wall time, identical results.

    .venv/bin/python bench/bench_ray.py [--scale-10x]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
from _common import fitted_policy, ingested_run

from tongyi_trace.run import open_run
from tongyi_trace.sim.sweep import SweepConfig, run_sweep

POLICIES = ["lru", "fifo", "lfu", "s3fifo", "gdsf", "wa", "oracle"]
CAPACITIES = "0.25L,0.5L,1L,2L,4L,1%,10%,inf"
TIMING = {"elapsed_s", "evict_decision_ns", "refs_per_s"}
PROBES = [("lru", "1L"), ("wa", "1L"), ("oracle", "1L"), ("gdsf", "4L")]


@contextmanager
def ray_cluster() -> Iterator[str]:
    """A 2-CPU Ray head on this machine (its own process group, stopped at the end); yields its address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = Path(tempfile.mkdtemp(prefix="kvr"))
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    log = tmp / "ray.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
                                 "--num-cpus", "2", "--port", str(port), "--node-ip-address", "127.0.0.1",
                                 "--disable-usage-stats", "--include-dashboard", "false", "--temp-dir", str(tmp)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while "Ray runtime started" not in log.read_text():
            if proc.poll() is not None:
                raise RuntimeError(log.read_text()[-2000:])
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def sweep(run: Path, policy: Path, executor: str, address: str | None) -> tuple[float, list[dict[str, Any]]]:
    """(wall seconds, rows) of the 7 x 8 sweep."""
    t0 = time.perf_counter()
    res = run_sweep(open_run(run), SweepConfig(policies=POLICIES, capacities=CAPACITIES, params_path=policy,
                                               executor=executor, ray_address=address, write=False))
    wall = time.perf_counter() - t0
    assert res.summary["num_failed"] == 0, res.summary["failed"]
    return wall, res.rows


def _noop(task: int, shared: Any) -> int:
    return task + int(shared["stream"].shape[0] > 0)


def task_overhead(run: Path, executor: str, address: str | None, num_tasks: int = 400) -> float:
    """Milliseconds a task costs the executor itself: NUM_TASKS empty tasks over the run's block array."""
    import numpy as np

    from tongyi_trace.executor import ExecutorOptions, map_tasks

    shared = {"stream": np.asarray(pl.read_parquet(run / "blocks.parquet", columns=["chain_id"])["chain_id"])}
    map_tasks(_noop, list(range(8)), shared, lambda _o: None, ExecutorOptions(executor, address))  # warm
    t0 = time.perf_counter()
    map_tasks(_noop, list(range(num_tasks)), shared, lambda _o: None, ExecutorOptions(executor, address))
    return (time.perf_counter() - t0) / num_tasks * 1000


def differences(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    """'policy @ capacity: field local != ray' for every non-timing field that differs."""
    return [f"{x['policy']} @ {x['capacity']}: {k} {x[k]!r} != {y.get(k)!r}" for x, y in zip(a, b, strict=False)
            for k in x if k not in TIMING and x[k] != y.get(k)]


def probe(run: Path, policy: Path, name: str, capacity: str) -> dict[str, Any]:
    """One simulation in this (fresh) process: seconds, RSS of the loaded stream, peak RSS of the task."""
    import psutil

    from tongyi_trace.policy.file import load_policy
    from tongyi_trace.sim.capacity import parse_capacities, peak_live_blocks
    from tongyi_trace.sim.simulate import simulate_policy
    from tongyi_trace.sim.stream import load_stream, next_request_of_refs

    stream = load_stream(open_run(run).tables())
    nxt = next_request_of_refs(stream.req_off, stream.blk, stream.num_ids)
    cap = parse_capacities(capacity, num_distinct=stream.num_ids, block_size_tokens=stream.block_size, model=None,
                           peak_live=int(peak_live_blocks(stream.req_off, nxt)))[0]
    fit = load_policy(policy)
    simulate_policy(stream, name, 16, fit=fit, next_req=nxt)  # compile (cached on disk) before measuring
    base_mib = psutil.Process().memory_info().rss / 2**20
    stream_mib = sum(getattr(stream, f).nbytes for f in ("req_off", "blk", "ntok", "req_cat", "req_time_s",
                                                          "req_tokens", "req_idx")) / 2**20 + nxt.nbytes / 2**20
    peak = [base_mib]
    stop = threading.Event()

    def sample() -> None:  # the task's own peak (ru_maxrss would include loading the stream)
        while not stop.wait(0.005):
            peak[0] = max(peak[0], psutil.Process().memory_info().rss / 2**20)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    res = simulate_policy(stream, name, cap.num_blocks, fit=fit, next_req=nxt)
    secs = time.perf_counter() - t0
    stop.set()
    sampler.join()
    peak_mib = peak[0]
    return {"policy": name, "capacity": capacity, "capacity_blocks": cap.num_blocks, "seconds": secs,
            "num_refs": stream.num_refs, "stream_mib": stream_mib, "process_mib": base_mib,
            "task_extra_mib": max(peak_mib - base_mib, 0.0), "hit_ratio": res.hit_ratio}


def probes(run: Path, policy: Path) -> list[dict[str, Any]]:
    """Every PROBES entry, each in a fresh child process (clean peak RSS)."""
    out = []
    for name, cap in PROBES:
        proc = subprocess.run([sys.executable, __file__, "--probe", str(run), str(policy), name, cap],
                              check=True, capture_output=True, text=True)
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def print_probes(label: str, rows: list[dict[str, Any]]) -> None:
    """Per-task figures and the projection: cores for 10,000 configurations in 10 minutes."""
    print(f"per task, {label} ({rows[0]['num_refs']:,} refs; shared stream arrays {rows[0]['stream_mib']:.0f} MiB "
          f"once per node, worker process {rows[0]['process_mib']:.0f} MiB):")
    for r in rows:
        print(f"  {r['policy']:7} @ {r['capacity']:4} ({r['capacity_blocks']:>10,} blocks): {r['seconds']:7.2f} s, "
              f"+{r['task_extra_mib']:6.0f} MiB peak over the loaded process")
    mean_s = sum(r["seconds"] for r in rows) / len(rows)
    print(f"  mean {mean_s:.2f} s a task -> 10,000 configurations in 10 min need "
          f"{10_000 * mean_s / 600:.0f} cores (plus the per-task overhead below)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale-10x", action="store_true", help="Also probe tasks on the 10x to-C trace.")
    ap.add_argument("--probe", nargs=4, metavar=("RUN", "POLICY_FILE", "POLICY", "CAPACITY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        run, pol, name, cap = args.probe
        print(json.dumps(probe(Path(run), Path(pol), name, cap)))
        return
    run = ingested_run("to-c")
    policy = fitted_policy(run)
    sweep(run, policy, "local", None)  # warm: numba's on-disk cache, page cache
    local_s, local_rows = sweep(run, policy, "local", None)
    with ray_cluster() as address:
        sweep(run, policy, "ray", address)  # warm the cluster's worker processes
        ray_s, ray_rows = sweep(run, policy, "ray", address)
        ray_ms = task_overhead(run, "ray", address)
    local_ms = task_overhead(run, "local", None)
    diffs = differences(local_rows, ray_rows)
    same = not diffs and len(local_rows) == len(ray_rows)
    n = len(local_rows)
    task_s = sum(r["elapsed_s"] for r in local_rows)  # simulation time inside the tasks
    print(f"sweep {len(POLICIES)} policies x 8 capacities = {n} tasks on 2 cores: local {local_s:.1f} s, "
          f"ray {ray_s:.1f} s (connected to a running cluster); ratio {ray_s / local_s:.2f} (target <= 1.3); "
          f"rows identical: {same}")
    for d in diffs[:5]:
        print(f"  differs: {d}")
    print(f"  simulation time inside the {n} tasks {task_s:.1f} s, {task_s / n:.2f} s a task: 10,000 configurations "
          f"in 10 min need {10_000 * task_s / n / 600:.0f} cores at this scale")
    print(f"  empty tasks (shared: the run's block array): local pool {local_ms:.1f} ms a task, "
          f"ray {ray_ms:.1f} ms a task (including connecting and one ray.put per call)")
    print_probes("default to-C trace (Trace-A scale)", probes(run, policy))
    if args.scale_10x:
        big = ingested_run("to-c", scale=10.0)
        print_probes("10x to-C trace", probes(big, fitted_policy(big)))


if __name__ == "__main__":
    main()
