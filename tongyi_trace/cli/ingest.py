"""`kvtrace ingest` and `kvtrace export`: trace file <-> normalized run folder."""

from __future__ import annotations

from pathlib import Path

import typer

from tongyi_trace.budget import resolve_budget
from tongyi_trace.cli import app
from tongyi_trace.cli._common import console, print_json, progress, run_cli
from tongyi_trace.errors import InputError, UsageError

INGEST_SCHEMA = "kvtrace.ingest-output/1"
EXPORT_SCHEMA = "kvtrace.export-output/1"


@app.command()
def ingest(
    trace: Path = typer.Argument(..., help="Trace file: Bailian or Mooncake JSONL (.gz/.zst ok) or kvtrace Parquet."),
    out: Path = typer.Option(..., "-o", "--out", help="Run folder to write the normalized tables into."),
    fmt: str = typer.Option(None, "--format", help="Force the format: bailian, mooncake, aiperf or parquet."),
    block_size: int = typer.Option(None, "--block-size", help="Tokens per hash id (default 16 Bailian, 512 Mooncake)."),
    turn_buckets: str = typer.Option("1,2,3", "--turn-buckets", help="Turn bucket lower bounds for categories."),
    on_error: str = typer.Option("fail", "--on-error", help="'fail' on a bad line, or 'skip' it and count it."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a run folder that holds another trace "
                                   "(deletes its analysis/, fit/, sim/, replay/ results and report)."),
    infer_sessions: bool = typer.Option(None, "--infer-sessions/--no-infer-sessions", show_default=False,
                                        help="Link each request to the earlier one whose whole prompt it "
                                        "continues, for parent_chat_id, turn and session_id (default: on for "
                                        "Mooncake traces, which have no chat ids; off when the trace has them)."),
    memory_limit_gib: float | None = typer.Option(None, "--memory-limit-gib",
                                                  help="Memory budget of the whole process, GiB (default: a "
                                                       "quarter of this machine's, at most 6)."),
    json_out: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no table."),
) -> None:
    """Read a trace once, validate it and write requests/blocks Parquet + provenance into a run folder.

    Example: kvtrace ingest ../shared/traces/mooncake_conversation.jsonl -o runs/conv
    """
    def go() -> dict[str, object]:
        from tongyi_trace.trace.categories import parse_turn_buckets
        from tongyi_trace.trace.ingest import ingest_trace, summarize

        with progress(quiet or json_out, unit="bytes") as bar:
            task = bar.add_task(f"reading {trace.name}", total=trace.stat().st_size if trace.is_file() else None)
            prov = ingest_trace(trace, out, fmt=fmt, block_size=block_size,
                                turn_buckets=parse_turn_buckets(turn_buckets), on_error=on_error,
                                overwrite=overwrite, infer_sessions=infer_sessions,
                                duckdb_limit=budget.duckdb_limit,
                                progress=lambda done, size: bar.update(task, completed=done, total=size))
        return summarize(prov)

    budget = run_cli(lambda: resolve_budget(memory_limit_gib))
    summary = run_cli(go, budget)
    if json_out:
        print_json({"run_dir": str(out.resolve()), **summary}, INGEST_SCHEMA)
        return
    if quiet:
        return
    from rich.table import Table

    t = Table(title=f"ingested {trace.name} -> {out}", show_header=False)  # plain text: console markup is off
    for k, v in summary.items():
        if k != "findings":
            t.add_row(k, f"{v:,.1f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v))
    findings = summary["findings"]
    assert isinstance(findings, dict)
    t.add_row("findings", ", ".join(f"{k}: {v:,}" for k, v in findings.items()) or "none")
    console.print(t)


@app.command()
def export(
    run_dir: Path = typer.Argument(..., help="Run folder written by 'kvtrace ingest'."),
    out: Path = typer.Option(..., "-o", "--out", help="Output trace: .parquet (lossless) or .jsonl (Bailian)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing -o file (never the run's own trace)."),
    json_out: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing on success."),
) -> None:
    """Write a run folder back out as a trace file (Parquet ingests back to identical tables).

    Example: kvtrace export runs/conv -o conv.parquet
    """
    def go() -> int:
        from tongyi_trace.run import open_run
        from tongyi_trace.trace.export import export_trace

        run = open_run(run_dir)
        if out.is_dir():
            raise UsageError(f"{out}: is a folder; give -o the trace file to write (.parquet or .jsonl)")
        try:
            return export_trace(run, out, force=force)
        except OSError as e:
            raise InputError(f"{out}: cannot write ({e.strerror or e}); check the path and free space") from None

    n = run_cli(go)
    if json_out:
        print_json({"path": str(out.resolve()), "num_requests": n}, EXPORT_SCHEMA)
    elif not quiet:
        console.print(f"wrote {n:,} requests to {out}")
