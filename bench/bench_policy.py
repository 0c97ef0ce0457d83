"""Does the exported policy win on traces it was not fitted on? (`make bench`)

Fit on the default to-C trace of seed 1 (the whole trace is the train window) with `kvtrace fit
--capacity` at 0.125L..4L, then simulate the exported choice (`-p fitted`) and every baseline (LRU, FIFO,
LFU, S3-FIFO, GDSF) and the oracle on seeds 2 and 3. Prints, per seed and capacity: the exported policy
minus the best baseline and minus LRU (hit-ratio points), the share of the LRU-to-oracle gap it closes,
its QTTFT against LRU's (the default cost model), the LRU-to-oracle gap split by `oracle-dead` (what
knowing which blocks are never used again would add to LRU, and what knowing when adds on top), and the
wall time of `fit --capacity` with 5 capacities.
Targets (the policy issue): >= 0 at every capacity, >= +1.5 points at 0.25L, 0.5L and 1L; fit < 60 s.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from _common import BENCH_DIR, KVTRACE, ingested_run

from tongyi_trace.fit.tune import lru_gap_closed

CAPACITIES = "0.125L,0.25L,0.5L,1L,2L,4L"
BASELINES = ("lru", "fifo", "lfu", "s3fifo", "gdsf")


def fit(run: Path, capacities: str, out: Path) -> float:
    """`kvtrace fit RUN --capacity CAPACITIES -o OUT`; its wall time."""
    t0 = time.perf_counter()
    subprocess.run([*KVTRACE, "fit", str(run), "--capacity", capacities, "-o", str(out), "-q"], check=True)
    return time.perf_counter() - t0


def simulate(run: Path, policy: Path) -> list[dict]:
    """Every baseline, both oracles and the exported choice at CAPACITIES over RUN."""
    policies = ",".join([*BASELINES, "oracle-dead", "oracle", "fitted"])
    res = subprocess.run([*KVTRACE, "simulate", str(run), "-p", policies,
                          "-c", CAPACITIES, "--policy-file", str(policy), "--json"], check=True,
                         capture_output=True, text=True)
    return json.loads(res.stdout)["rows"]


def main() -> None:
    train = ingested_run("to-c", 1.0, seed=1)
    policy = BENCH_DIR / "policy-toc-s1.json"
    t_fit6 = fit(train, CAPACITIES, policy)
    t_fit5 = fit(train, "0.25L,0.5L,1L,2L,4L", BENCH_DIR / "policy-toc-s1-5caps.json")
    doc = json.loads(policy.read_text())
    print(f"fit --capacity on to-C seed 1: 6 capacities {t_fit6:.1f} s, 5 capacities {t_fit5:.1f} s "
          "(target < 60 s)")
    print(f"  context classes: {doc.get('context')}; {len(doc['categories'])} categories; the choice per capacity "
          "made on the train window's held-out half")
    for ch in doc["choices"]:
        print(f"  {ch['capacity']:>7} ({ch['capacity_blocks']:,} blocks): {ch['policy']} {ch['params']}  "
              f"held-out gain vs LRU {100 * ch['train']['gain_vs_lru']:+.2f} pts")
    worst: dict[str, float] = {}
    for seed in (2, 3):
        run = ingested_run("to-c", 1.0, seed=seed)
        rows = simulate(run, policy)
        by = {(r["policy"], r["capacity"]): r for r in rows}
        print(f"\nto-C seed {seed} (policy fitted on seed 1): hit ratio points, QTTFT mean")
        print(f"{'capacity':>9} {'exported':>9} {'LRU':>7} {'best baseline':>20} {'- best':>7} {'- LRU':>7} "
              f"{'gap closed':>10} {'QTTFT vs LRU':>12} {'oracle-LRU = whether + when':>28}")
        for cap in CAPACITIES.split(","):
            exp, lru, orc = by[("fitted", cap)], by[("lru", cap)], by[("oracle", cap)]
            dead = by[("oracle-dead", cap)]["hit_ratio"]
            best = max((by[(b, cap)] for b in BASELINES), key=lambda r: r["hit_ratio"])
            d_best = 100 * (exp["hit_ratio"] - best["hit_ratio"])
            d_lru = 100 * (exp["hit_ratio"] - lru["hit_ratio"])
            closed = lru_gap_closed(exp["hit_ratio"], lru["hit_ratio"], orc["hit_ratio"])
            q = exp["qttft_mean_s"] / lru["qttft_mean_s"] - 1 if lru["qttft_mean_s"] > 0 else float("nan")
            worst[cap] = min(worst.get(cap, float("inf")), d_best)
            print(f"{cap:>9} {exp['hit_ratio']:9.4f} {lru['hit_ratio']:7.4f} "
                  f"{best['policy'] + ' ' + format(best['hit_ratio'], '.4f'):>20} {d_best:+7.2f} {d_lru:+7.2f} "
                  f"{100 * closed:9.1f}% {100 * q:+11.1f}% "
                  f"{100 * (orc['hit_ratio'] - lru['hit_ratio']):11.2f} = {100 * (dead - lru['hit_ratio']):5.2f} + "
                  f"{100 * (orc['hit_ratio'] - dead):5.2f}")
    ok = all(v >= 0 for v in worst.values()) and all(worst[c] >= 1.5 for c in ("0.25L", "0.5L", "1L"))
    print("\nworst (seeds 2, 3) exported minus best baseline: "
          + ", ".join(f"{c} {v:+.2f}" for c, v in worst.items())
          + f"  -> targets {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
