"""Scale: wall time, seconds per million block references and peak resident memory of each command on the
to-C profile scaled up (`kvtrace synth --profile to-c --seed 5 --scale K`), generated here and cached in
--dir (default .bench/). Every command runs as a child under a ceiling on the resident memory of its whole
process tree (polled; the child is killed past it, and its row says so) and with `--memory-limit-gib` set
just under it.

Issue 41's targets: s per M refs at each scale within 1.3x of the same at the smallest scale (the linear-cost
ratio); peak <= 6 GB up to 30x, <= 12 GB above. Each row is printed (and appended to --out, JSON lines) as
soon as its command finishes, so an interruption loses nothing done; the ratios close the table.
Usage: python bench/bench_scale.py [--scales 1,30,100] [--ceiling-gb 6] [--only ingest,analyze,fit]
[--dir DIR] [--out rows.jsonl] [--clean] (`make bench` runs the defaults; the 100x trace is 7.1 GB of JSONL,
generated in about 4 minutes with a 10 GB peak).
The row `simulate sweep` is the four policies in one command.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BENCH_DIR, GB, KVTRACE, run_capped

SIM_POLICIES = ("lru", "s3fifo", "wa", "oracle")
CAPACITIES = "0.25L,1L"
MAX_RATIO = 1.3  # s per M refs at a scale / at the smallest scale


def ceiling_gb_at(scale: float) -> float:
    """Issue 41's peak target at SCALE: 6 GB up to 30x, 12 GB above."""
    return 6.0 if scale <= 30 else 12.0


def commands(run: Path, trace: Path, limit_gib: float, policy_file: Path) -> list[tuple[str, list[str]]]:
    """(name, kvtrace arguments) of every measured command, in order (ingest first: the others read its run;
    fit before simulate wa, which reads its policy file)."""
    lim = ["--memory-limit-gib", f"{limit_gib:g}"]
    out = [("ingest", ["ingest", str(trace), "-o", str(run), "--overwrite", "-q", *lim]),
           ("analyze", ["analyze", str(run), "-q", *lim]),
           ("fit", ["fit", str(run), "--capacity", CAPACITIES, "-o", str(policy_file), "-q", *lim])]
    out += [(f"simulate {p}", ["simulate", str(run), "-p", p, "-c", CAPACITIES, "--json", "-q", *lim,
                               *(["--policy-file", str(policy_file)] if p == "wa" else [])]) for p in SIM_POLICIES]
    out.append(("simulate sweep", ["simulate", str(run), "-p", ",".join(SIM_POLICIES), "-c", CAPACITIES, "--json",
                                   "-q", *lim, "--policy-file", str(policy_file)]))
    return out


def wanted(name: str, only: str | None) -> bool:
    """Whether --only ONLY selects the command NAME ("simulate" selects every simulate row)."""
    if not only:
        return True
    names = [n.strip() for n in only.split(",")]
    return name in names or name.split()[0] in names


def num_refs_of(run: Path) -> int:
    """The run's block references (its provenance), 0 before it is ingested."""
    prov = run / "provenance.json"
    return int(json.loads(prov.read_text())["num_block_refs"]) if prov.exists() else 0


def row_text(r: dict) -> str:
    """One line of the table."""
    ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f} {'pass' if r['ratio'] <= MAX_RATIO else 'FAIL'}"
    verdict = ("pass" if r["peak_gb"] <= r["target_gb"] else "FAIL") if r["status"] == "ok" else \
        ("FAIL" if r["status"].startswith("killed") else "-")  # a command that stopped did not finish
    peak = f"{r['peak_gb']:.2f} {verdict}"
    return (f"{r['scale']:>5g}x {r['command']:<16} {r['refs_m']:>8.1f} {r['wall_s']:>9.1f} {r['s_per_mref']:>9.3f} "
            f"{peak:>12} {ratio:>11}  {r['status']}")


def main() -> None:
    """Print the table: per scale and command, wall s, s per M refs, peak GB, the linear-cost ratio."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="1,30,100")
    ap.add_argument("--ceiling-gb", type=float, default=None,
                    help="Ceiling per command (default: 6 up to 30x, 12 above).")
    ap.add_argument("--only", default=None,
                    help="Comma-separated command names (ingest, analyze, fit, simulate, 'simulate lru'..., "
                         "'simulate sweep').")
    ap.add_argument("--dir", type=Path, default=BENCH_DIR, help="Where the traces and runs go (default .bench/).")
    ap.add_argument("--out", type=Path, default=None, help="Also append each row to this JSON-lines file.")
    ap.add_argument("--clean", action="store_true", help="Delete each scale's trace and run after its rows.")
    a = ap.parse_args()
    scales = sorted(float(s) for s in a.scales.split(","))
    base: dict[str, float] = {}  # command -> s per M refs at the smallest scale
    ratios: list[tuple[str, float, float]] = []
    print(f"{'scale':>6} {'command':<16} {'refs M':>8} {'wall s':>9} {'s/M refs':>9} {'peak GB':>12} "
          f"{'cost ratio':>11}  status", flush=True)
    for k in scales:
        ceiling_gb = a.ceiling_gb or ceiling_gb_at(k)
        limit_gib = round(ceiling_gb * GB / 2**30 * 0.95, 2)  # GiB, so the process stays under the GB ceiling
        a.dir.mkdir(parents=True, exist_ok=True)
        trace = a.dir / f"scale-to-c-s5-x{k:g}.jsonl"
        run = trace.with_suffix(".run")
        if not trace.exists():
            t0 = time.perf_counter()
            partial = trace.with_suffix(".part.jsonl")
            subprocess.run([*KVTRACE, "synth", "--profile", "to-c", "--seed", "5", "--scale", f"{k:g}",
                            "-o", str(partial), "-q"], check=True)
            partial.rename(trace)
            print(f"# {k:g}x: synth {time.perf_counter() - t0:.0f} s, {trace.stat().st_size / GB:.2f} GB",
                  flush=True)
        for name, args in commands(run, trace, limit_gib, trace.with_suffix(".policy.json")):
            if not wanted(name, a.only):
                continue
            m = run_capped([*KVTRACE, *args], int(ceiling_gb * GB))
            refs = num_refs_of(run)
            status = ("killed at the ceiling" if m.killed else "ok" if m.code == 0
                      else f"exit {m.code}: {m.stderr.splitlines()[-1] if m.stderr else ''}")
            spm = m.wall_s / (refs / 1e6) if refs else float("nan")
            ratio = None
            if m.code == 0:
                if k == scales[0]:
                    base[name] = spm
                elif name in base:
                    ratio = spm / base[name]
                    ratios.append((name, k, ratio))
            row = {"scale": k, "command": name, "refs_m": refs / 1e6, "wall_s": m.wall_s, "s_per_mref": spm,
                   "peak_gb": m.peak_bytes / GB, "target_gb": ceiling_gb_at(k), "ratio": ratio, "status": status,
                   "limit_gib": limit_gib}
            print(row_text(row), flush=True)
            if a.out:
                with a.out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
        if a.clean:
            shutil.rmtree(run, ignore_errors=True)
            for p in trace.parent.glob(trace.stem + "*"):
                if p.is_file():
                    p.unlink()
    for name, k, ratio in ratios:
        print(f"{name}: s per M refs at {k:g}x / at {scales[0]:g}x = {ratio:.2f} (target <= {MAX_RATIO}): "
              f"{'pass' if ratio <= MAX_RATIO else 'FAIL'}")


if __name__ == "__main__":
    main()
