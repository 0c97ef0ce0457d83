"""Replay figures for the note: dispatch drift and client CPU at 20/50/100 req/s against a local stand-in
endpoint (tongyi_trace.replay.standin in its own process, NOT vLLM; target p99 < 5 ms), the drift of a to-C
trace at 100 req/s (long prompts, bursts; target p99 < 10 ms), and the real CPU
vLLM engine's hit ratio vs the simulator's LRU prediction at three cache capacities.

Run: .venv/bin/python bench/bench_replay.py [--skip-engine] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from tongyi_trace import engine as eng
from tongyi_trace.replay.runner import ReplayOptions, run_replay
from tongyi_trace.replay.schedule import ScheduleOptions
from tongyi_trace.trace.ingest import ingest_trace
from tongyi_trace.trace.synth import synth_to_file

RATES_PER_S = (20, 50, 100)
CAPACITIES_BLOCKS = (150, 300, 600)
OPEN_LOOP_SPEEDUP = 20.0  # requests overlap in the engine: what a loaded GPU server looks like


def _constant_rate_trace(path: Path, rate_per_s: float, seconds: float) -> None:
    """Bailian JSONL: requests at a constant rate, 1,000-token prompts sharing a 512-token head, 2 outputs."""
    n = int(rate_per_s * seconds)
    with path.open("w") as fh:
        for i in range(n):
            ids = list(range(32)) + [1000 + i * 100 + k for k in range(31)]
            fh.write(json.dumps({"chat_id": i, "parent_chat_id": -1, "timestamp": i / rate_per_s,
                                 "input_length": 1000, "output_length": 2, "type": "text", "turn": 1,
                                 "hash_ids": ids}) + "\n")


def bench_drift(seconds: float) -> None:
    """Drift p50/p99 and client CPU share per rate, against the stand-in in a separate process."""
    server = subprocess.Popen([sys.executable, "-m", "tongyi_trace.replay.standin"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"dispatch drift vs a stand-in endpoint ({url}, separate process), {seconds:.0f} s per rate; "
              f"machine load average {load} on {os.cpu_count()} CPUs (drift includes OS scheduling delay)")
        print(f"{'req/s':>6} {'requests':>9} {'drift p50 ms':>13} {'drift p99 ms':>13} {'max ms':>8} "
              f"{'client CPU %':>13} {'CPU ms/req':>11} {'errors':>7}")
        me = psutil.Process()
        with tempfile.TemporaryDirectory() as tmp:
            for rate in RATES_PER_S:
                trace = Path(tmp) / f"r{rate}.jsonl"
                _constant_rate_trace(trace, rate, seconds)
                run = Path(tmp) / f"run{rate}"
                ingest_trace(trace, run)
                cpu0, t0 = me.cpu_times(), time.monotonic()
                res = run_replay(run, url, ReplayOptions(name="bench"))
                cpu1, wall = me.cpu_times(), time.monotonic() - t0
                cpu_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
                cpu_pct = 100 * cpu_s / wall
                d = res.summary["drift_ms"]
                ok = "ok " if d["p99"] < 5.0 else "MISS"
                done = res.summary["counts"]["num_done"]
                print(f"{rate:>6} {done:>9} {d['p50']:>13.3f} {d['p99']:>13.3f} "
                      f"{d['max']:>8.2f} {cpu_pct:>13.1f} {1e3 * cpu_s / max(done, 1):>11.2f} "
                      f"{res.summary['counts']['num_error']:>7}  "
                      f"p99<5ms {ok}")
    finally:
        server.terminate()
        server.wait(timeout=10)


def bench_wakeup_floor(rate_per_s: float, seconds: float) -> None:
    """The machine's floor: how late an asyncio loop doing nothing else wakes for deadlines at RATE_PER_S (OS
    scheduling and timer slack). No dispatch can be more punctual than this."""
    import asyncio

    import numpy as np

    async def sleeper() -> list[float]:
        t0, late = time.perf_counter(), []
        for i in range(int(rate_per_s * seconds)):
            due = t0 + i / rate_per_s
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            late.append((time.perf_counter() - due) * 1e3)
        return late

    late = np.array(asyncio.run(sleeper()))
    print(f"\nfloor: an idle asyncio loop waking at {rate_per_s:g}/s is late by p50 {np.percentile(late, 50):.3f} ms, "
          f"p99 {np.percentile(late, 99):.3f} ms, max {late.max():.1f} ms (load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")


def bench_drift_toc(rate_per_s: float, seconds: float) -> None:
    """Drift of a to-C synthetic trace (its bursts, prompts of up to tens of thousands of tokens, 16 output
    tokens each) at a mean of RATE_PER_S requests/s against the stand-in: the bodies of long prompts are
    what the dispatch must build off the critical path."""
    server = subprocess.Popen([sys.executable, "-m", "tongyi_trace.replay.standin"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        with tempfile.TemporaryDirectory() as tmp:
            trace, run = Path(tmp) / "toc.jsonl", Path(tmp) / "run"
            num = int(rate_per_s * seconds)
            synth_to_file("to-c", 1, trace, num_requests=num, duration_s=seconds)
            ingest_trace(trace, run)
            res = run_replay(run, url, ReplayOptions(name="bench-toc", schedule=ScheduleOptions(max_output_tokens=16)))
        s = res.summary
        d, mean_in = s["drift_ms"], s["prompt_tokens_ok"] / max(s["counts"]["num_ok"], 1)
        ok = "ok " if d["p99"] < 10.0 else "MISS"
        print(f"\nto-C trace at {rate_per_s:g} req/s ({s['counts']['num_done']} requests, mean prompt "
              f"{mean_in:,.0f} tokens, 16 output tokens): drift p50 {d['p50']:.3f} ms, p99 {d['p99']:.3f} ms, "
              f"max {d['max']:.1f} ms, {s['counts']['num_error']} errors  p99<10ms {ok}")
    finally:
        server.terminate()
        server.wait(timeout=10)


def bench_engine(num_requests: int) -> None:
    """Engine /metrics hit ratio vs the simulator's LRU prediction at three capacities (fresh engine each)."""
    if not eng.is_installed():
        print("engine vs simulator: skipped (run 'kvtrace engine install')")
        return
    print(f"\nengine vs simulator hit ratio: to-C synthetic, {num_requests} requests, 32-token blocks, "
          "max-model-len 2048, 4 output tokens; simulator = one request at a time")
    print(f"{'blocks':>7} {'engine':>8} {'simulator LRU':>14} {'gap pp':>7} {'exact share':>12} {'ideal':>7} "
          f"{'replay s':>9}  dispatch")
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "toc.jsonl"
        synth_to_file("to-c", 1, trace, num_requests=400, duration_s=600)
        run = Path(tmp) / "run"
        ingest_trace(trace, run)
        for blocks in CAPACITIES_BLOCKS:
            name = f"bench-{blocks}"
            st = eng.start(num_blocks=blocks, block_size=32, max_model_len=2048, name=name)
            try:
                rows = [("one at a time", _engine_row(run, st.url, f"b{blocks}", 1, 1000.0, num_requests))]
                if blocks == CAPACITIES_BLOCKS[1]:
                    rows.append((f"open loop x{OPEN_LOOP_SPEEDUP:g}", _engine_row(
                        run, st.url, f"b{blocks}-open", None, OPEN_LOOP_SPEEDUP, num_requests)))
            finally:
                eng.stop(name)
            for label, (hr, pr, exact, ideal, wall, peak) in rows:
                print(f"{blocks:>7} {hr:>8.4f} {pr:>14.4f} {100 * (hr - pr):>+7.2f} {exact:>12.3f} "
                      f"{ideal:>7.4f} {wall:>9.1f}  {label} (TTFT p50 {peak:.0f} ms)")


def _engine_row(run: Path, url: str, name: str, max_in_flight: int | None, speedup: float,
                num_requests: int) -> tuple[float, float, float, float, float, float]:
    """(engine hit ratio, simulator LRU, exact share, ideal, wall s, TTFT p50 ms) of one replay."""
    t0 = time.monotonic()
    res = run_replay(run, url, ReplayOptions(
        name=name, max_in_flight=max_in_flight, reset_cache=True,
        schedule=ScheduleOptions(speedup=speedup, max_requests=num_requests, max_output_tokens=4)))
    wall = time.monotonic() - t0
    s, rec = res.summary, res.summary["reconciliation"] or {}
    return (s["metrics"]["hit_ratio"], rec.get("predicted_hit_ratio", float("nan")),
            rec.get("exact_share", float("nan")), rec.get("ideal_hit_ratio", float("nan")), wall,
            s["ttft_ms"]["p50"] or float("nan"))


def main() -> None:
    """Run the benchmarks."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=10.0, help="Trace seconds per dispatch rate.")
    ap.add_argument("--engine-requests", type=int, default=200)
    ap.add_argument("--skip-engine", action="store_true", help="Only the dispatch drift part.")
    a = ap.parse_args()
    bench_drift(a.seconds)
    bench_drift_toc(100.0, a.seconds)
    bench_wakeup_floor(100.0, a.seconds)
    if not a.skip_engine:
        bench_engine(a.engine_requests)


if __name__ == "__main__":
    main()
