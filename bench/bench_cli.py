"""CLI start-up: `kvtrace --help` and every command's `--help` (the engine's subcommands included) against
`python -c "import typer, rich"`, the floor any Typer + Rich command pays, measured in the same run.
Target: within 1.5x. Each figure is the best of 5 runs in child processes, the floor run before every one
of them, the commands taken in turn (5 rounds over all of them: a burst of load slows one round, not one
command). The verdict uses CPU time (user + sys of the child: what start-up costs, unaffected by other
processes on a shared machine); wall time and its ratio are printed beside it. The last line names the
slowest command.

    python bench/bench_cli.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tongyi_trace.cli import COMMANDS

RUNS = 5
TARGET_RATIO = 1.5
FLOOR = [sys.executable, "-c", "import typer, rich"]


def run_s(args: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + sys) seconds of one run of ARGS."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} exited with {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def help_invocations() -> list[list[str]]:
    """`--help`, then `CMD --help` for every command, and `engine SUB --help` for the engine's subcommands."""
    from tongyi_trace.cli.engine import engine_app

    subs = [info.name or "" for info in engine_app.registered_commands]
    return [["--help"], *([name, "--help"] for name in COMMANDS), *(["engine", sub, "--help"] for sub in subs)]


def main() -> None:
    """Print each command's `--help` start-up time and its ratios to the floor."""
    invocations = help_invocations()
    floor_runs: list[list[tuple[float, float]]] = [[] for _ in invocations]
    cmd_runs: list[list[tuple[float, float]]] = [[] for _ in invocations]
    for _ in range(RUNS):  # round-robin: a burst of load on a shared machine slows one round, not one command
        for i, args in enumerate(invocations):
            floor_runs[i].append(run_s(FLOOR))
            cmd_runs[i].append(run_s([sys.executable, "-m", "tongyi_trace.cli", *args]))
    worst = (0.0, "")
    for args, floors, cmds in zip(invocations, floor_runs, cmd_runs, strict=True):
        floor = [min(col) for col in zip(*floors, strict=True)]
        cmd = [min(col) for col in zip(*cmds, strict=True)]
        cpu_ratio, wall_ratio = cmd[1] / floor[1], cmd[0] / floor[0]
        verdict = "ok" if cpu_ratio <= TARGET_RATIO else f"above the {TARGET_RATIO}x target"
        print(f"kvtrace {' '.join(args)}: CPU {cmd[1] * 1e3:.0f} ms = {cpu_ratio:.2f}x 'import typer, rich' "
              f"({floor[1] * 1e3:.0f} ms), wall {cmd[0] * 1e3:.0f} ms = {wall_ratio:.2f}x ({floor[0] * 1e3:.0f} "
              f"ms): {verdict}")
        worst = max(worst, (cpu_ratio, " ".join(args)))
    print(f"slowest: kvtrace {worst[1]} at {worst[0]:.2f}x the floor's CPU time (target {TARGET_RATIO}x)")


if __name__ == "__main__":
    main()
