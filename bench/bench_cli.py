"""CLI start-up: `kvtrace --help` and `kvtrace ingest --help` against `python -c "import typer, rich"` (the floor
any Typer + Rich command pays). Target: within 1.5x. Best of 5 runs each, in child processes.
Typer 0.29 builds every command's parameters through pydantic (typer._adapters), which `import typer` does
not load: a second floor, `import typer, rich, typer._adapters`, is what any command's own help pays.

    python bench/bench_cli.py
"""

from __future__ import annotations

import subprocess
import sys
import time

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


def main() -> None:
    """Print each command's start-up time and its ratio to the floor."""
    floor = best_wall_s([sys.executable, "-c", "import typer, rich"])
    print(f"python -c 'import typer, rich': {floor * 1e3:.0f} ms (best of {RUNS})")
    adapters = best_wall_s([sys.executable, "-c", "import typer, rich, typer._adapters"])
    print(f"python -c 'import typer, rich, typer._adapters' (pydantic): {adapters * 1e3:.0f} ms = "
          f"{adapters / floor:.2f}x")
    for args in (["--help"], ["ingest", "--help"], ["simulate", "--help"]):
        wall = best_wall_s([sys.executable, "-m", "tongyi_trace.cli", *args])
        ratio = wall / floor
        verdict = "ok" if ratio <= TARGET_RATIO else f"above the {TARGET_RATIO}x target"
        print(f"kvtrace {' '.join(args)}: {wall * 1e3:.0f} ms = {ratio:.2f}x ({verdict})")


if __name__ == "__main__":
    main()
