"""`kvtrace report RUN_DIR`: render the run folder's artifacts into RUN_DIR/report.html."""

from __future__ import annotations

from pathlib import Path

import typer

from tongyi_trace.cli import app
from tongyi_trace.cli._common import abs_path, print_json, run_cli, run_or_trace, say


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="Run folder (from 'kvtrace ingest' / 'kvtrace analyze'), or a raw "
                                   "trace (ingested first)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Where to write the HTML "
                                    "(default RUN_DIR/report.html)."),
    screenshot_png: Path | None = typer.Option(None, "--screenshot", metavar="PNG",
                                               help="Also save a full-page PNG taken in headless Chromium."),
    as_json: bool = typer.Option(False, "--json", help="Print where the files were written, as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing on success."),
) -> None:
    """Write a self-contained HTML report (works offline) from the run folder's saved artifacts."""

    def go() -> dict[str, str | None]:
        from tongyi_trace.report import render_report, screenshot
        from tongyi_trace.sim.recommend import report_sweep

        run = run_or_trace(run_dir)
        html = render_report(run, out)
        png = screenshot(html, screenshot_png) if screenshot_png is not None else None
        sweep = report_sweep(run.path)
        return {"report": abs_path(html), "screenshot": abs_path(png) if png else None,
                "sweep": sweep.describe() if sweep and (sweep.path / "summary.json").is_file() else None}

    written = run_cli(go)
    if as_json:
        print_json(written, "kvtrace.report-output/1")
    elif not quiet:
        if written["sweep"]:
            say(f"the Recommendation and the simulator's sections read {written['sweep']}")
        say("report: ", (str(written["report"]), "bold"))
        if written["screenshot"]:
            say("screenshot: ", (str(written["screenshot"]), "bold"))
