"""`kvtrace study`: ingest + analyze + fit many traces in parallel, then the cross-trace report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from tongyi_trace.cli import app, source_value
from tongyi_trace.cli._common import console, print_json, progress, run_cli, say
from tongyi_trace.models import DEFAULT_MODEL
from tongyi_trace.schemas import STUDY_SCHEMA

if TYPE_CHECKING:
    from rich.table import Table

    from tongyi_trace.study import StudyResult


@app.command()
def study(
    traces: str = typer.Argument(..., metavar="DIR_OR_GLOB",
                                 help="A folder of traces or a quoted glob; file-name order = window order."),
    out: Path = typer.Option(..., "-o", "--out", help="Study folder: run folders, tables, index.html."),
    capacity: str = typer.Option(source_value("study", "DEFAULT_CAPACITIES"), "--capacity", "-c",
                                 help="Capacities of the LRU / WA comparison (simulate's units)."),
    model: str = typer.Option(DEFAULT_MODEL, "--model", help="Model preset (x HBM capacities, QTTFT)."),
    jobs: int = typer.Option(0, "--jobs", "-j", help="Worker processes of the local executor (0 = one per core)."),
    executor: str = typer.Option("local", "--executor", help="local (process pool) or ray (a Ray cluster; "
                                 "pip install 'kvtrace[ray]'; run folders must be on storage every node sees)."),
    ray_address: str | None = typer.Option(None, "--ray-address", metavar="ADDR",
                                           help="Ray cluster (default: $RAY_ADDRESS, else a local Ray instance)."),
    json_out: bool = typer.Option(False, "--json", help="Print the study summary as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress and no table."),
) -> None:
    """Every trace into its own run (ingest, analyze, fit, report, LRU vs WA); how the fits drift across
    windows and how WA fitted on one window does on the next."""
    from tongyi_trace.executor import ExecutorOptions
    from tongyi_trace.study import StudyOptions, run_study

    opts = StudyOptions(capacities=capacity, model=model, executor=ExecutorOptions(executor, ray_address, jobs))
    with progress(quiet or json_out) as bar:
        task = bar.add_task("study", total=None)
        result = run_cli(lambda: run_study(traces, out, opts, lambda what, done, total: bar.update(
            task, completed=done, total=total, description=what)))
    if json_out:
        print_json(result.summary, STUDY_SCHEMA)
    elif not quiet:
        console.print(_table(result))
        console.print(f"tables and index.html in {result.out_dir}")
    if result.summary["num_failed"]:
        say(("error:", "bold red"), f" {result.summary['num_failed']} task(s) failed (see 'error' in "
            f"{result.out_dir / 'windows.jsonl'} and study.json)", err=True)
        raise typer.Exit(1)


def _table(result: StudyResult) -> Table:
    from rich.table import Table

    t = Table(title="study: windows")
    for c in ("window", "requests", "ideal hit", "capacity", "LRU", "WA own fit", "WA prev fit", "error"):
        t.add_column(c, justify="left" if c in ("window", "capacity", "error") else "right")
    hit = {(r["window"], r["capacity"], r["policy"]): r["hit_ratio"] for r in result.transfer}
    caps = list(dict.fromkeys(r["capacity"] for r in result.transfer)) or [""]
    for w in result.windows:
        for i, cap in enumerate(caps):
            cells = [hit.get((w["window"], cap, p)) for p in ("lru", "wa-own", "wa-prev")]
            t.add_row(w["window"] if i == 0 else "", f"{w.get('num_requests') or 0:,}" if i == 0 else "",
                      f"{w['ideal_hit_ratio']:.4f}" if i == 0 and w.get("ideal_hit_ratio") is not None else "",
                      cap, *("-" if c is None else f"{c:.4f}" for c in cells), (w.get("error") or "") if i == 0 else "")
    return t
