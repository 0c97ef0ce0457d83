"""`kvtrace synth --like RUN --check` over every run x seed: the twin's pass/fail matrix (issue 38 item 4).

Runs: both public Mooncake traces (../shared/traces, skipped when absent) and every profile at seed 1,
full size and at the test's quarter size (`--scale 0.25`), each ingested once into .bench/twin/.
Each twin is checked as `kvtrace synth --like RUN --seed S --check` does (calibration/twin.py: drawn,
written, ingested, analyzed, its LRU curve), the run's own figures measured once. Prints one line a run
and seed: each figure's twin value (a KS row: the distance), '*' on a miss, the --like draw's wall time,
then the count of runs x seeds holding every figure.

    python bench/bench_twin.py [--seeds 1-5] [--runs mc,mcs,to-c,to-c-q,...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from _common import BENCH_DIR, REPO

from tongyi_trace.calibration.twin import check_twin, measure
from tongyi_trace.fit.synth_like import WORKLOAD_FILE, synth_like_to_file, workload_summary
from tongyi_trace.run import RunDir
from tongyi_trace.trace.ingest import ingest_trace
from tongyi_trace.trace.synth import PROFILES, synth_to_file

TRACES = REPO.parent / "shared" / "traces"
WORK = BENCH_DIR / "twin"
QUARTER = 0.25  # tests/calibration/test_twin.py's size for the profiles
COLUMNS = [("ideal_hit", "ideal"), ("lru_1%", "lru1"), ("lru_5%", "lru5"), ("lru_10%", "lru10"),
           ("lru_25%", "lru25"), ("ks_reuse_time", "ks_reuse"), ("ks_arrival", "ks_rate"),
           ("ks_input", "ks_in"), ("ks_output", "ks_out")]


def run_names() -> dict[str, tuple[str, float]]:
    """Name -> (trace source: a Mooncake file's path or a profile, scale)."""
    runs: dict[str, tuple[str, float]] = {}
    for name, file in (("mc", "mooncake_conversation.jsonl"), ("mcs", "mooncake_synthetic.jsonl")):
        if (TRACES / file).is_file():
            runs[name] = (str(TRACES / file), 1.0)
    for profile in PROFILES:
        runs[profile] = (profile, 1.0)
        runs[f"{profile}-q"] = (profile, QUARTER)
    return runs


def prepare(name: str, source: str, scale: float) -> Path:
    """The run NAME in WORK (ingested once), with its workload summary written fresh as fit/workload.json."""
    run = WORK / name
    if not (run / "provenance.json").is_file():
        shutil.rmtree(run, ignore_errors=True)
        trace = Path(source)
        if not trace.is_file():
            trace = WORK / f"{name}.jsonl"
            synth_to_file(source, 1, trace, scale=scale)
        ingest_trace(trace, run)
    (run / "fit").mkdir(exist_ok=True)
    (run / "fit" / WORKLOAD_FILE).write_text(json.dumps(workload_summary(RunDir(run).tables())))
    return run


def seeds_of(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main() -> None:
    all_runs = run_names()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1-5", help="twin seeds, e.g. 1-5 or 3")
    ap.add_argument("--runs", default=",".join(all_runs), help="comma-separated, of: " + ", ".join(all_runs))
    args = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    seeds = seeds_of(args.seeds)
    print(f"{'run':9s} {'seed':>4s} " + " ".join(f"{c:>9s}" for _, c in COLUMNS) + "   draw_s", flush=True)
    held = total = 0
    for name in args.runs.split(","):
        run = prepare(name, *all_runs[name])
        figures = measure(RunDir(run))
        print(f"{name:9s} {'run':>4s} {figures.ideal_hit:9.3f} "
              + " ".join(f"{figures.lru[p]:9.3f}" for p in ("1%", "5%", "10%", "25%")), flush=True)
        for seed in seeds:
            with tempfile.TemporaryDirectory(dir=WORK) as tmp:
                t0 = time.perf_counter()
                synth_like_to_file(run, seed, Path(tmp) / "twin.jsonl")
                draw_s = time.perf_counter() - t0
            rows = {r.key: r for r in check_twin(run, seed, work_dir=WORK, run_figures=figures)}
            cells = [f"{rows[k].twin:8.3f}{' ' if rows[k].ok else '*'}" for k, _ in COLUMNS]
            ok = all(r.ok for r in rows.values())
            held += ok
            total += 1
            print(f"{name:9s} {seed:4d} " + " ".join(cells) + f" {draw_s:7.1f}  {'pass' if ok else 'FAIL'}",
                  flush=True)
    print(f"\n{held} of {total} runs x seeds hold every figure (* = outside the tolerance: ideal +-0.02, "
          "LRU +-0.03, reuse-time KS <= 0.10, rate/length KS <= 0.05)")


if __name__ == "__main__":
    main()
