"""Scale: wall time, seconds per million block references and peak resident memory of each command on the
to-C profile scaled up (`kvtrace synth --profile to-c --seed 5 --scale K`), generated here and cached in
.bench/. Every command runs as a child under a ceiling on the resident memory of its whole process tree
(polled; the child is killed past it, and its row says so) and with `--memory-limit-gib` set to it.

Issue 41's targets: s per M refs at the largest scale within 1.3x of 1x; peak <= 6 GB at 30x, <= 12 GB
at 100x. Usage: python bench/bench_scale.py [--scales 1,30,100] [--ceiling-gib 6] [--only ingest,analyze]
[--dir DIR] (`make bench` runs the defaults; the 100x trace is 6.7 GB of JSONL: --dir puts the traces and
their runs elsewhere than .bench/). The row `simulate sweep` is the four policies in one command.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BENCH_DIR, GB, KVTRACE, run_capped

SIM_POLICIES = ("lru", "s3fifo", "wa", "oracle")
CAPACITIES = "0.25L,1L"


def commands(run: Path, trace: Path, limit_gib: float, policy_file: Path) -> list[tuple[str, list[str]]]:
    """(name, kvtrace arguments) of every measured command, in order (ingest first: the others read its run)."""
    lim = ["--memory-limit-gib", f"{limit_gib:g}"]
    out = [("ingest", ["ingest", str(trace), "-o", str(run), "--overwrite", "-q", *lim]),
           ("analyze", ["analyze", str(run), "-q", *lim]),
           ("fit", ["fit", str(run), "--capacity", CAPACITIES, "-o", str(policy_file), "-q", *lim])]
    out += [(f"simulate {p}", ["simulate", str(run), "-p", p, "-c", CAPACITIES, "--json", "-q", *lim,
                               *(["--policy-file", str(policy_file)] if p == "wa" else [])]) for p in SIM_POLICIES]
    out.append(("simulate sweep", ["simulate", str(run), "-p", ",".join(SIM_POLICIES), "-c", CAPACITIES, "--json",
                                   "-q", *lim, "--policy-file", str(policy_file)]))
    return out


def main() -> None:
    """Print the table: per scale and command, wall s, s per M refs, peak GB; then the cost ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="1,30,100")
    ap.add_argument("--ceiling-gib", type=float, default=None,
                    help="Ceiling per command (default: 6 up to 30x, 12 above).")
    ap.add_argument("--only", default=None,
                    help="Comma-separated command names (ingest, analyze, fit, simulate lru..., simulate sweep).")
    ap.add_argument("--dir", type=Path, default=BENCH_DIR, help="Folder of the scaled traces and runs.")
    a = ap.parse_args()
    scales = [float(s) for s in a.scales.split(",")]
    per_mref: dict[str, dict[float, float]] = {}
    print(f"{'scale':>6} {'command':<16} {'refs M':>8} {'wall s':>9} {'s/M refs':>9} {'peak GB':>8}  status")
    for k in scales:
        ceiling_gib = a.ceiling_gib or (6.0 if k <= 30 else 12.0)
        limit_gib = round(ceiling_gib * 0.95, 2)
        trace = a.dir / f"scale-to-c-s5-x{k:g}.jsonl"
        run = trace.with_suffix(".run")
        if not trace.exists():
            a.dir.mkdir(exist_ok=True)
            subprocess.run([*KVTRACE, "synth", "--profile", "to-c", "--seed", "5", "--scale", f"{k:g}",
                            "-o", str(trace), "-q"], check=True)
        refs = 0
        for name, args in commands(run, trace, limit_gib, trace.with_suffix(".policy.json")):
            if a.only and name not in a.only.split(",") and name.split()[0] not in a.only.split(","):
                continue
            m = run_capped([*KVTRACE, *args], int(ceiling_gib * GB))
            if not refs and (run / "provenance.json").exists():
                refs = int(json.loads((run / "provenance.json").read_text())["num_block_refs"])
            status = ("killed at the ceiling" if m.killed else "ok" if m.code == 0
                      else f"exit {m.code}: {m.stderr.splitlines()[-1] if m.stderr else ''}")
            spm = m.wall_s / (refs / 1e6) if refs else float("nan")
            if m.code == 0:
                per_mref.setdefault(name, {})[k] = spm
            print(f"{k:>5g}x {name:<16} {refs / 1e6:>8.1f} {m.wall_s:>9.1f} {spm:>9.3f} {m.peak_bytes / GB:>8.2f}  "
                  f"{status}", flush=True)
    lo, hi = min(scales), max(scales)
    for name, by in per_mref.items():
        if lo in by and hi in by and hi != lo:
            print(f"{name}: s per M refs at {hi:g}x / at {lo:g}x = {by[hi] / by[lo]:.2f} (target <= 1.3)")


if __name__ == "__main__":
    main()
