"""CLI start-up: `kvtrace --help` and every command's `--help` (the engine's subcommands included) against
`python -c "import typer, rich"`, the floor any Typer + Rich command pays, measured in the same run.
Target: within 1.5x. Best of 5 runs each, in child processes. The last line names the slowest command.

    python bench/bench_cli.py
"""

from __future__ import annotations

import subprocess
import sys
import time

from tongyi_trace.cli import COMMANDS

RUNS = 5
TARGET_RATIO = 1.5


def best_wall_s(args: list[str]) -> float:
    """The fastest of RUNS runs of ARGS (seconds)."""
    best = float("inf")
    for _ in range(RUNS):
        t0 = time.perf_counter()
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - t0)
    return best


def help_invocations() -> list[list[str]]:
    """`--help`, then `CMD --help` for every command, and `engine SUB --help` for the engine's subcommands."""
    from tongyi_trace.cli.engine import engine_app

    subs = [info.name or "" for info in engine_app.registered_commands]
    return [["--help"], *([name, "--help"] for name in COMMANDS), *(["engine", sub, "--help"] for sub in subs)]


def main() -> None:
    """Print each command's `--help` start-up time and its ratio to the floor."""
    floor = best_wall_s([sys.executable, "-c", "import typer, rich"])
    print(f"python -c 'import typer, rich': {floor * 1e3:.0f} ms (best of {RUNS})")
    worst = (0.0, "")
    for args in help_invocations():
        wall = best_wall_s([sys.executable, "-m", "tongyi_trace.cli", *args])
        ratio = wall / floor
        verdict = "ok" if ratio <= TARGET_RATIO else f"above the {TARGET_RATIO}x target"
        print(f"kvtrace {' '.join(args)}: {wall * 1e3:.0f} ms = {ratio:.2f}x ({verdict})")
        worst = max(worst, (ratio, " ".join(args)))
    print(f"slowest: kvtrace {worst[1]} at {worst[0]:.2f}x the floor (target {TARGET_RATIO}x)")


if __name__ == "__main__":
    main()
