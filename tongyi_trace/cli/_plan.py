"""The planner's summary that `kvtrace simulate` prints before its table (tongyi_trace/sim/recommend.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tongyi_trace.cli._common import say


def recommendation_json(result: Any) -> dict[str, Any]:
    """The recommendation document of a SweepResult, with the run's fleet sweep (RUN_DIR/sim/fleet/) if any."""
    from tongyi_trace.sim.recommend import fleet_rows, recommend

    run_dir = result.summary.get("run_dir")
    fleet = fleet_rows(Path(run_dir) / "sim" / "fleet") if run_dir else None
    return recommend(result.rows, result.curve, result.summary, fleet_rows=fleet)


def print_recommendation(result: Any) -> dict[str, Any]:
    """Print the Recommendation block of a SweepResult, then how byte capacities were converted; return the
    recommendation document."""
    from tongyi_trace.sim.recommend import describe

    rec = recommendation_json(result)
    say(("Recommendation", "bold"))
    for line in describe(rec):
        say(("  " + line, "bold red" if line.startswith("WARNING") else ""))
    if result.summary.get("params_path"):
        say(f"fitted policy file: {result.summary['params_path']}")
    for c in result.summary.get("capacities") or []:
        if c.get("bytes_per_block"):
            say(f"capacity {c['label']} = {c['num_blocks']:,} blocks at {c['bytes_per_block']:,} KV bytes per block "
                f"of model {result.summary.get('model')}")
    return rec


def print_sweeps(run_path: Path, name: str | None) -> None:
    """Name the named sweeps kept in RUN/sim/ and which one RUN/sim/ holds now."""
    from tongyi_trace.sim.recommend import report_sweep
    from tongyi_trace.sim.sweep import list_sweeps

    names = list_sweeps(run_path)
    if names:
        say(f"named sweeps in {run_path / 'sim'}: {', '.join(names)}; RUN/sim/ holds "
            f"{'the sweep ' + repr(name) if name else 'this unnamed sweep'}")
    shown = report_sweep(run_path)
    if shown is not None:
        say(f"the report and the Recommendation of the run read {shown.describe()}")
