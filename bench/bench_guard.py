"""The guard and the online refit on a shifted trace (`make bench`).

To-C synth at its default size (43,000 requests, two hours), seeds 1, 2 and 3. The policy is `kvtrace fit
--train 0:3600 --capacity` on the first hour; each capacity runs the WA setting it chose (WA's defaults
where it chose a baseline: marked *). The stream carries the file's context classes. The shifted trace is
the same two hours with the categories' behaviour changed at 3600 s: every request of the second hour
takes the category of the reversed list (file-1 <-> text-3+, file-2 <-> text-2, ...), so each category
name now behaves as another.
Printed per capacity (hit-ratio points over the second hour, against LRU): the stale fit without guard
or refit, with the guard, with the refit, with both; the refit's gain over LRU from shift + 2 x refit_s
to the end next to the first hour's gain; and on the unshifted trace the guard's cost and the
throughput of guard + refit relative to plain WA.
`python bench/bench_guard.py RUN ...` runs it on other ingested runs (each one's first-hour policy is made
once, beside it). On a quarter-size trace the first hour's fit chose a baseline at every capacity, so every
row was a stress row; at full size it chooses WA where it gains, the case the guard is for.
Targets (the guard issue): guard loss <= 0.3 points at every capacity; refit recovers within 2 x refit_s;
unshifted cost <= 0.1 points; throughput >= 50%.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
from _common import ingested_run, kvtrace

from tongyi_trace.policy.file import load_policy
from tongyi_trace.run import open_run
from tongyi_trace.sim.guarded import simulate_guarded
from tongyi_trace.sim.simulate import simulate_policy
from tongyi_trace.sim.stream import Stream, load_stream

SHIFT_S = 3600.0
CAPACITIES = "0.125L,0.5L,2L"
GUARD = {"guard": True}  # the guard's defaults otherwise
REFIT = {"refit_s": 600.0, "window_s": 1200.0}
NO_GUARD = {"guard": False}


def shifted(stream: Stream) -> Stream:
    """STREAM with the second hour's categories reversed."""
    cat = stream.req_cat.copy()
    late = stream.req_time_s >= SHIFT_S
    cat[late] = len(stream.categories) - 1 - cat[late]
    return dataclasses.replace(stream, req_cat=cat)


def ratio(hits: np.ndarray, stream: Stream, lo_s: float, hi_s: float = np.inf) -> float:
    """Block hit ratio of the requests arriving in [LO_S, HI_S)."""
    m = (stream.req_time_s >= lo_s) & (stream.req_time_s < hi_s)
    return float(hits[m].sum() / np.diff(stream.req_off)[m].sum())


def timed_pair(a, b, rounds: int = 3):  # type: ignore[no-untyped-def]
    """(A(), B(), the best wall seconds of each over ROUNDS alternating runs): the machine is shared, and
    alternating keeps a change of load from favouring one side."""
    best = [np.inf, np.inf]
    out = [None, None]
    for _ in range(rounds):
        for i, fn in enumerate((a, b)):
            t0 = time.perf_counter()
            out[i] = fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return out[0], out[1], best[0], best[1]


SEEDS = (1, 2, 3)


def main() -> None:
    runs = [Path(a) for a in sys.argv[1:]] or [ingested_run("to-c", 1.0, seed=s) for s in SEEDS]
    rows = [row for run in runs for row in bench_run(run)]
    if any(r["stress"] for r in rows):
        print("* the file chose a baseline there (WA's held-out gain was not significant): WA runs with its "
              "defaults, a setting the fit advised against, so the guard meets a policy wrong from the start")
    for label, sel in (("rows where the file chose WA", [r for r in rows if not r["stress"]]), ("every row", rows)):
        if not sel:
            continue
        loss, cost = min(r["guard"] for r in sel), max(r["cost"] for r in sel)
        thr = min(r["throughput"] for r in sel)
        print(f"targets over {label} ({len(sel)}): guard's worst hour-2 result vs LRU {loss:+.2f} points "
              f"(target >= -0.30: {'met' if loss >= -0.3 else 'NOT met'}); worst unshifted cost {cost:+.2f} "
              f"(target <= +0.10: {'met' if cost <= 0.1 else 'NOT met'}); lowest throughput {thr:.0%} "
              f"(target >= 50%: {'met' if thr >= 0.5 else 'NOT met'})")
    gained = [r for r in rows if not r["stress"] and r["hour1"] > 0]
    if gained:
        worst = min(r["recovered"] for r in gained)
        print(f"refit: ahead of LRU again from the shift + 2 x refit_s on every row where the file chose WA and it "
              f"gained in hour 1 ({len(gained)}): worst {worst:+.2f} points ({'met' if worst > 0 else 'NOT met'})")


def bench_run(run: Path) -> list[dict[str, float | bool]]:
    """Print RUN's rows and return their figures (guard: hour 2 vs LRU, cost, throughput, stress: the file
    chose a baseline there)."""
    policy_path = Path(str(run.with_suffix("")) + ".h1.policy.json")
    if not policy_path.exists():
        kvtrace("fit", str(run), "--train", f"0:{SHIFT_S:g}", "--capacity", CAPACITIES, "-o", str(policy_path), "-q")
    fit = load_policy(policy_path)
    base = load_stream(open_run(run).tables(), context=fit.context)
    moved = shifted(base)
    print(f"{run.name}: {base.num_requests} requests, {base.num_refs} refs; fit on 0:{SHIFT_S:g} s; "
          f"categories reversed at {SHIFT_S:g} s; guard defaults, refit {REFIT}")
    print("points vs LRU        | hour 1 WA | hour 2: stale  guard  refit  both | refit from +1200 s| "
          "switches | unshifted: guard cost  thr.(g+r)")
    rows: list[dict[str, float | bool]] = []
    for choice in fit.choices:
        cap, params = choice.capacity_blocks, dict(choice.params)
        lru = simulate_policy(moved, "lru", cap)
        stale = simulate_policy(moved, "wa", cap, params=params, fit=fit)
        g = simulate_guarded(moved, "wa", cap, params={**params, **GUARD}, fit=fit)
        r = simulate_guarded(moved, "wa", cap, params={**params, **REFIT, **NO_GUARD}, fit=fit)
        b = simulate_guarded(moved, "wa", cap, params={**params, **GUARD, **REFIT}, fit=fit)
        l2 = ratio(lru.req_hit_blocks, moved, SHIFT_S)
        h1 = 100 * (ratio(stale.req_hit_blocks, moved, 0, SHIFT_S) - ratio(lru.req_hit_blocks, moved, 0, SHIFT_S))
        d2 = [100 * (ratio(x.req_hit_blocks, moved, SHIFT_S) - l2) for x in (stale, g.result, r.result, b.result)]
        rec_from = SHIFT_S + 2 * REFIT["refit_s"]
        rec = 100 * (ratio(r.result.req_hit_blocks, moved, rec_from) - ratio(lru.req_hit_blocks, moved, rec_from))
        lru_u = simulate_policy(base, "lru", cap)
        plain, both, t_plain, t_both = timed_pair(
            partial(simulate_policy, base, "wa", cap, params=params, fit=fit),
            partial(simulate_guarded, base, "wa", cap, params={**params, **GUARD, **REFIT}, fit=fit))
        gu = simulate_guarded(base, "wa", cap, params={**params, **GUARD}, fit=fit)
        cost = 100 * (plain.hit_ratio - gu.result.hit_ratio)
        mark = " " if choice.policy == "wa" else "*"
        print(f"{choice.capacity:>6}{mark}({cap:>6} blocks) | {h1:+9.2f} | {d2[0]:+13.2f} {d2[1]:+6.2f} {d2[2]:+6.2f} "
              f"{d2[3]:+5.2f} | {rec:+17.2f} | {len(g.switches):>3}/{len(b.switches):<4} | "
              f"{cost:+10.2f} ({len(gu.switches)} sw) {t_plain / t_both:5.0%}   "
              f"[unshifted WA-LRU {100 * (plain.hit_ratio - lru_u.hit_ratio):+.2f}, "
              f"both-LRU {100 * (both.result.hit_ratio - lru_u.hit_ratio):+.2f}]")
        rows.append({"guard": d2[1], "cost": cost, "throughput": t_plain / t_both, "stress": choice.policy != "wa",
                     "hour1": h1, "recovered": rec})
    return rows


if __name__ == "__main__":
    main()
