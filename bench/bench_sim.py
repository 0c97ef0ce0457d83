"""Benchmark of `kvtrace simulate` against libCacheSim on the default to-C synthetic trace (~6 M refs).

One run, side by side, same machine: for LRU, FIFO, LFU, S3-FIFO and GDSF at two capacities, M refs/s of
kvtrace's prefix-cache kernel and of libCacheSim (PyPI libcachesim) fed the same flattened chain-id stream
(each request's blocks deepest first, object size 1, cache size in blocks) from an oracleGeneral file;
then WA's speed, the one-pass LRU curve against one libCacheSim LRU run, and a 7-policy x 8-capacity
sweep on all cores. Each side's time is the best of three runs (the machine may be shared), and the ratio
compares the two measured in the same run. Targets: every shared policy >= 4x libCacheSim, LRU >= 8x,
WA >= 5 M refs/s, curve faster than one libCacheSim LRU run, sweep < 60 s on 2 cores.

    .venv/bin/python bench/bench_sim.py [--run RUN_DIR] [--shared-only]
        --run: an ingested run folder instead of the default to-C synthetic trace (cached in .bench/)
        --shared-only: only the policies shared with libCacheSim
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from _common import fitted_policy, ingested_run

from tongyi_trace.policy.file import load_policy
from tongyi_trace.run import open_run
from tongyi_trace.sim.lru_curve import lru_curve
from tongyi_trace.sim.simulate import simulate_policy
from tongyi_trace.sim.stream import Stream, load_stream, next_request_of_refs
from tongyi_trace.sim.sweep import SweepConfig, run_sweep

SHARED = {"lru": "LRU", "fifo": "FIFO", "lfu": "LFU", "s3fifo": "S3FIFO", "gdsf": "GDSF"}
TARGET_RATIO = {"lru": 8.0}  # kvtrace refs/s over libCacheSim's, per policy
DEFAULT_TARGET_RATIO = 4.0
WA_TARGET_M_REFS_S = 5.0
REPEATS = 3


def write_oracle_general(stream: Stream, path: Path) -> None:
    """libCacheSim's oracleGeneral binary: (u32 time, u64 id, u32 size, i64 next access vtime), deepest first."""
    lens = np.diff(stream.req_off)
    order = np.concatenate([np.arange(e - 1, s - 1, -1) for s, e in zip(stream.req_off[:-1], stream.req_off[1:],
                                                                        strict=True)]) if stream.num_refs else []
    ids = stream.blk[np.asarray(order, np.int64)]
    req_of = np.repeat(np.arange(stream.num_requests), lens)
    nxt = np.full(ids.size, -1, np.int64)
    last = np.full(stream.num_ids, -1, np.int64)
    for i in range(ids.size - 1, -1, -1):  # one pass, ~6 M: fine for a benchmark setup
        nxt[i] = last[ids[i]]
        last[ids[i]] = i
    rec = np.zeros(ids.size, dtype=np.dtype([("t", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")]))
    rec["t"] = (stream.req_time_s[req_of]).astype(np.uint32)
    rec["id"] = ids + 1
    rec["size"] = 1
    rec["next"] = np.where(nxt < 0, np.iinfo(np.int64).max, nxt)
    rec.tofile(path)


def libcachesim_run(path: Path, name: str, capacity: int) -> tuple[float, float]:
    """(seconds, hit ratio) of libCacheSim policy NAME over the oracleGeneral file."""
    import libcachesim as lcs

    reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE,
                             lcs.ReaderInitParam(ignore_obj_size=True))
    cache = getattr(lcs, name)(cache_size=capacity)
    t0 = time.perf_counter()
    miss_ratio, _ = cache.process_trace(reader)
    return time.perf_counter() - t0, 1.0 - miss_ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=Path, help="an ingested run folder (default: the to-C synthetic trace)")
    ap.add_argument("--shared-only", action="store_true", help="only the policies shared with libCacheSim")
    args = ap.parse_args()
    run_path = args.run or ingested_run("to-c")
    stream = load_stream(open_run(run_path).tables())
    og = run_path.with_suffix(".oracleGeneral.bin")
    if not og.is_file():
        write_oracle_general(stream, og)
    refs = stream.num_refs
    print(f"to-C synthetic: {stream.num_requests:,} requests, {refs:,} refs, {stream.num_ids:,} distinct blocks")
    caps = [stream.num_ids // 100, stream.num_ids // 10]
    simulate_policy(stream, "lru", 10)  # load the compiled kernels before timing
    print(f"{'policy':8} {'capacity':>9} {'kvtrace M/s':>12} {'libCacheSim M/s':>16} {'ratio':>6}"
          f" {'kvtrace hit':>12} {'lcs hit (no prefix rule)':>25}")
    lcs_lru_s = None
    for pol, lname in SHARED.items():
        target = TARGET_RATIO.get(pol, DEFAULT_TARGET_RATIO)
        for cap in caps:
            simulate_policy(stream, pol, 10)
            ours = min((simulate_policy(stream, pol, cap) for _ in range(REPEATS)), key=lambda r: r.elapsed_s)
            lcs_s, lcs_hit = min(libcachesim_run(og, lname, cap) for _ in range(REPEATS))
            if pol == "lru" and lcs_lru_s is None:
                lcs_lru_s = lcs_s
            ratio = lcs_s / ours.elapsed_s
            print(f"{pol:8} {cap:>9,} {refs / ours.elapsed_s / 1e6:>12.2f} {refs / lcs_s / 1e6:>16.2f} "
                  f"{ratio:>6.2f} {ours.hit_ratio:>12.4f} {lcs_hit:>25.4f}   "
                  f"(target >= {target:g}x: {'met' if ratio >= target else 'NOT met'})")
    if args.shared_only:
        return
    policy_path = fitted_policy(run_path)
    fit = load_policy(policy_path)
    wa_stream = load_stream(open_run(run_path).tables(), context=fit.context)  # the categories the file was fitted on
    simulate_policy(wa_stream, "wa", 10, fit=fit)
    for cap in caps:
        wa = min((simulate_policy(wa_stream, "wa", cap, fit=fit) for _ in range(REPEATS)), key=lambda r: r.elapsed_s)
        rate = refs / wa.elapsed_s / 1e6
        print(f"wa       {cap:>9,} {rate:>12.2f}   (target >= {WA_TARGET_M_REFS_S:g} M refs/s: "
              f"{'met' if rate >= WA_TARGET_M_REFS_S else 'NOT met'})"
              f"   hit {wa.hit_ratio:.4f}, {wa.evict_decision_ns:.0f} ns per eviction, "
              f"{len(wa_stream.categories)} categories")
    nxt = next_request_of_refs(stream.req_off, stream.blk, stream.num_ids)
    for cap in caps:
        simulate_policy(stream, "oracle", 10, next_req=nxt)
        orc = simulate_policy(stream, "oracle", cap, next_req=nxt)
        print(f"oracle   {cap:>9,} {refs / orc.elapsed_s / 1e6:>12.2f}   hit {orc.hit_ratio:.4f}")
    curve = lru_curve(stream)
    assert lcs_lru_s is not None
    print(f"one-pass LRU curve (all {stream.num_ids:,} capacities): {curve.elapsed_s:.2f} s; one libCacheSim "
          f"LRU run: {lcs_lru_s:.2f} s; ratio {lcs_lru_s / curve.elapsed_s:.2f} (target > 1)")
    t0 = time.perf_counter()
    res = run_sweep(open_run(run_path), SweepConfig(
        policies=["lru", "fifo", "lfu", "s3fifo", "gdsf", "wa", "oracle"],
        capacities="0.25L,0.5L,1L,2L,4L,1%,10%,inf", params_path=policy_path, jobs=0, write=False))
    wall = time.perf_counter() - t0
    print(f"sweep 7 policies x 8 capacities on all cores: {wall:.1f} s wall (target < 60 s), "
          f"{len(res.rows)} results")


if __name__ == "__main__":
    main()
