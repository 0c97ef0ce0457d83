"""Does the exported policy win on traces it was not fitted on, beyond noise? (`make bench`)

Fit on the default to-C trace of seed 1 (the whole trace is the train window) with `kvtrace fit
--capacity` at 0.125L..4L, then simulate the exported choice (`fitted`), every baseline (LRU, FIFO, LFU,
S3-FIFO, GDSF) and the oracle on seeds 2 to 5. Per seed and capacity, with 95% intervals of the paired
session bootstrap (tongyi_trace/sim/bootstrap.py, the one `kvtrace fit` and `simulate` use): the exported
policy minus the best baseline and minus LRU (hit-ratio points), the share of the LRU-to-oracle gap it
closes, and its QTTFT against LRU's (the default cost model); then the wall time of `fit --capacity` with 5
capacities.
Targets (issue 39 item 5): the exported choice is never significantly worse than the best baseline (the
upper end of its interval of exported-minus-best-baseline >= 0), and is significantly better than LRU
(lower end > 0) wherever any candidate is; fit < 60 s.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
from _common import BENCH_DIR, KVTRACE, ingested_run

from tongyi_trace.fit.tune import lru_gap_closed
from tongyi_trace.run import open_run
from tongyi_trace.sim.bootstrap import Interval, stream_resampler
from tongyi_trace.sim.cost_model import preset_cost, qttft_s
from tongyi_trace.sim.simulate import simulate_policy
from tongyi_trace.sim.sweep import SweepConfig, sweep_inputs

CAPACITIES = "0.125L,0.25L,0.5L,1L,2L,4L"
BASELINES = ("lru", "fifo", "lfu", "s3fifo", "gdsf")
SEEDS = (2, 3, 4, 5)


def fit(run: Path, capacities: str, out: Path) -> float:
    """`kvtrace fit RUN --capacity CAPACITIES -o OUT`; its wall time."""
    t0 = time.perf_counter()
    subprocess.run([*KVTRACE, "fit", str(run), "--capacity", capacities, "-o", str(out), "-q"], check=True)
    return time.perf_counter() - t0


def evaluate(run_path: Path, policy: Path) -> list[dict]:
    """Per capacity of CAPACITIES over RUN_PATH: the exported choice against the best baseline and LRU, with
    the paired intervals."""
    run = open_run(run_path)
    cfg = SweepConfig(policies=[*BASELINES, "oracle", "fitted"], capacities=CAPACITIES, params_path=policy)
    inputs = sweep_inputs(run, cfg)
    stream = inputs.stream
    res, _ = stream_resampler(stream, run.requests()["session_id"].to_numpy())
    refs = np.diff(stream.req_off)
    cost = preset_cost("qwen2-7b")
    out = []
    for cap in inputs.capacities(CAPACITIES):
        hits = {p: simulate_policy(stream, p, cap.num_blocks, fit=inputs.fit, timing=False,
                                   next_req=inputs.next_req if p == "oracle" else None)
                for p in (*BASELINES, "oracle", "fitted")}
        ratio = {p: r.hit_ratio for p, r in hits.items()}
        best = max(BASELINES, key=lambda p: (ratio[p], p == "lru"))
        q = {p: qttft_s(cost, stream.req_time_s, stream.req_tokens - hits[p].req_hit_tokens) for p in ("fitted", "lru")}
        vs_lru = {p: res.ratio_gain(hits[p].req_hit_blocks, hits["lru"].req_hit_blocks, refs)
                  for p in (*BASELINES[1:], "fitted")}
        out.append({"capacity": cap.label, "fitted": ratio["fitted"], "lru": ratio["lru"], "best": best,
                    "best_hit": ratio[best], "oracle": ratio["oracle"],
                    "vs_best": res.ratio_gain(hits["fitted"].req_hit_blocks, hits[best].req_hit_blocks, refs),
                    "vs_lru": vs_lru["fitted"],
                    "any_significant": [p for p, g in vs_lru.items() if g.significant],
                    "qttft": res.mean_change(q["fitted"], q["lru"])})
    return out


def _pm(g: Interval) -> str:
    return f"{g.point:+6.2f} +- {g.half_width:4.2f}"


def main() -> None:
    train = ingested_run("to-c", 1.0, seed=1)
    policy = BENCH_DIR / "policy-toc-s1.json"
    t_fit6 = fit(train, CAPACITIES, policy)
    t_fit5 = fit(train, "0.25L,0.5L,1L,2L,4L", BENCH_DIR / "policy-toc-s1-5caps.json")
    doc = json.loads(policy.read_text())
    print(f"fit --capacity on to-C seed 1: 6 capacities {t_fit6:.1f} s, 5 capacities {t_fit5:.1f} s "
          "(target < 60 s)")
    print(f"  context classes: {doc.get('context')}; {len(doc['categories'])} categories; the choice per capacity "
          "made on the train window's held-out half, LRU unless significant at 95%")
    for ch in doc["choices"]:
        print(f"  {ch['capacity']:>7} ({ch['capacity_blocks']:,} blocks): {ch['policy']} {ch['params']}  "
              f"{ch['train'].get('reason', '')}")
    worse, missed = [], []
    for seed in SEEDS:
        rows = evaluate(ingested_run("to-c", 1.0, seed=seed), policy)
        print(f"\nto-C seed {seed} (policy fitted on seed 1): hit-ratio points with 95% intervals, QTTFT mean")
        print(f"{'capacity':>9} {'exported':>9} {'LRU':>7} {'best baseline':>20} {'exported - best':>16} "
              f"{'exported - LRU':>16} {'gap closed':>10} {'QTTFT vs LRU':>16}  significant over LRU")
        for r in rows:
            closed = lru_gap_closed(r["fitted"], r["lru"], r["oracle"])
            if r["vs_best"].hi < 0:
                worse.append(f"seed {seed} {r['capacity']}")
            if r["any_significant"] and not r["vs_lru"].significant:
                missed.append(f"seed {seed} {r['capacity']}")
            print(f"{r['capacity']:>9} {r['fitted']:9.4f} {r['lru']:7.4f} "
                  f"{r['best'] + ' ' + format(r['best_hit'], '.4f'):>20} {_pm(r['vs_best']):>16} "
                  f"{_pm(r['vs_lru']):>16} {100 * closed:9.1f}% {r['qttft'].text('+.1f') + '%':>16}  "
                  f"{','.join(r['any_significant']) or '-'}")
    print(f"\nexported significantly worse than the best baseline at: {', '.join(worse) or 'none'} "
          f"-> target {'met' if not worse else 'NOT met'}")
    print(f"a candidate significantly better than LRU but the exported choice not, at: {', '.join(missed) or 'none'} "
          f"-> target {'met' if not missed else 'NOT met'}")


if __name__ == "__main__":
    main()
