"""`kvtrace synth`: write a synthetic Qwen-Bailian trace (a profile, or `--like` a measured workload);
`--check` measures a profile's calibrated figures against their bands."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from tongyi_trace.cli import app, source_keys
from tongyi_trace.cli._common import abs_path, console, print_json, progress, run_cli
from tongyi_trace.errors import UsageError

if TYPE_CHECKING:
    from rich.table import Table

    from tongyi_trace.calibration.profiles import CheckRow
    from tongyi_trace.calibration.twin import TwinRow
    from tongyi_trace.trace.synth import SynthSummary


@app.command()
def synth(
    out: Path = typer.Option(None, "-o", "--out", help="Output JSONL (.gz/.zst compress by suffix)."),
    profile: str = typer.Option(None, "--profile",
                                help=f"Profile: {', '.join(source_keys('trace.synth', 'PROFILE_TABLE'))} "
                                "(trace A chatbot, trace B API, reasoning chat, agentic coding)."),
    like: Path = typer.Option(None, "--like", help="A run folder, or a workload.json or policy file from "
                              "'kvtrace fit': draw its synthetic twin (its prefix sharing, reuse times, rate and "
                              "lengths, in its block size)."),
    check: bool = typer.Option(False, "--check", help="Generate the profile (or the twin of the --like run "
                               "folder), ingest and analyze it, and print each calibrated figure with its band "
                               "(the run's value) and pass/fail (no -o needed)."),
    seed: int = typer.Option(0, "--seed", help="Random seed: the same seed gives a byte-identical file."),
    requests: int = typer.Option(None, "--requests", help="Number of requests (default: the profile's "
                                 "published size; --like: the measured trace's)."),
    duration: float = typer.Option(None, "--duration", help="Trace length in seconds (default 7,200; "
                                   "--like: the measured trace's)."),
    scale: float = typer.Option(1.0, "--scale", help="Multiply the number of requests (and users) by X."),
    json_out: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Generate a synthetic trace in the Qwen-Bailian JSONL format, deterministic for a seed.

    Examples: kvtrace synth --profile to-c --seed 1 -o toc.jsonl;
    kvtrace synth --like run/fit/workload.json --seed 1 -o like.jsonl.zst;
    kvtrace synth --profile to-c --seed 1 --check; kvtrace synth --like run --seed 1 --check
    """
    if check and like is not None:
        _check_like(like, out, profile, seed, json_out, quiet)
        return
    if check:
        _check(profile, like, out, seed, scale, json_out, quiet)
        return

    def go() -> SynthSummary:
        from tongyi_trace.trace.synth import PROFILES, synth_to_file

        if (profile is None) == (like is None):
            raise UsageError("give exactly one of --profile " + "|".join(PROFILES) + " or --like workload.json")
        if out is None:
            raise UsageError("give the output file with -o/--out (or --check to measure a profile)")
        with progress(quiet or json_out) as bar:
            bar.add_task("generating", total=None)
            if like is not None:
                from tongyi_trace.fit.synth_like import synth_like_to_file

                return synth_like_to_file(like, seed, out, requests, duration, scale)
            return synth_to_file(profile, seed, out, requests, duration, scale)

    summary = run_cli(go)
    if json_out:
        print_json({**summary.to_json(), "path": abs_path(summary.path)}, "kvtrace.synth-output/1")
        return
    if quiet:
        return
    from rich.table import Table

    t = Table(title=f"synthetic {summary.profile} trace -> {summary.path}", show_header=False)
    for k, v in summary.to_json().items():
        if k in ("path", "profile") or v is None:
            continue
        if isinstance(v, dict):
            v = ", ".join(f"{a} {b:.1%}" for a, b in v.items())
        t.add_row(k, f"{v:,.3f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v))
    console.print(t)
    if summary.block_size not in (16, 512):
        console.print(f"note: the twin has the run's {summary.block_size}-token blocks: ingest it with "
                      f"--block-size {summary.block_size}")


def _check(profile: str | None, like: Path | None, out: Path | None, seed: int, scale: float, json_out: bool,
           quiet: bool) -> None:
    """--check: the band table of PROFILE (measured through ingest, analyses and the LRU curve)."""
    def go() -> list[CheckRow]:
        from tongyi_trace.trace.synth import PROFILES

        if profile is None or out is not None:
            raise UsageError("--check takes --profile P (and --seed, --scale) or --like RUN (and --seed), not -o")
        if profile not in PROFILES:
            raise UsageError(f"unknown profile {profile!r}; use one of: {', '.join(PROFILES)}")
        from tongyi_trace.calibration.profiles import check_profile

        with progress(quiet or json_out) as bar:
            bar.add_task(f"generating, ingesting and analyzing {profile} seed {seed}", total=None)
            return check_profile(profile, seed, scale)

    rows = run_cli(go)
    if json_out:
        print_json({"profile": profile, "seed": seed, "scale": scale, "rows": [r.to_json() for r in rows]},
                   "kvtrace.synth-check/1")
    else:
        console.print(check_table(f"{profile} seed {seed} scale {scale:g}", rows))
    if any(r.ok is False for r in rows):
        raise typer.Exit(1)


def _check_like(like: Path, out: Path | None, profile: str | None, seed: int, json_out: bool, quiet: bool) -> None:
    """--like RUN --check: each figure of RUN and of its twin side by side, with pass/fail."""
    def go() -> list[TwinRow]:
        if profile is not None or out is not None:
            raise UsageError("--like RUN --check takes a run folder and --seed, not --profile or -o")
        from tongyi_trace.calibration.twin import check_twin

        with progress(quiet or json_out) as bar:
            bar.add_task(f"drawing, ingesting and analyzing the twin of {like} seed {seed}", total=None)
            return check_twin(like, seed)

    rows = run_cli(go)
    if json_out:
        print_json({"run": abs_path(str(like)), "seed": seed, "rows": [r.to_json() for r in rows]},
                   "kvtrace.synth-twin-check/1")
    else:
        from rich.table import Table

        t = Table(title=f"twin of {like} seed {seed}")
        for col in ("figure", "run", "twin", "tolerance", "pass"):
            t.add_column(col, justify="left" if col == "figure" else "right")
        for r in rows:
            t.add_row(r.label, "-" if r.run is None else f"{r.run:.4f}", f"{r.twin:.4f}", r.tolerance,
                      "pass" if r.ok else "FAIL")
        console.print(t)
    if not all(r.ok for r in rows):
        raise typer.Exit(1)


def check_table(title: str, rows: list[CheckRow]) -> Table:
    """The band table: figure, measured value, band, pass/fail (- = not checked at this scale)."""
    from rich.table import Table

    t = Table(title=title)
    for col in ("figure", "measured", "band", "pass"):
        t.add_column(col, justify="left" if col == "figure" else "right")
    for r in rows:
        t.add_row(r.label, "-" if r.value is None else f"{r.value:,.3f}", f"{r.lo:,.3g} - {r.hi:,.3g}",
                  "-" if r.ok is None else "pass" if r.ok else "FAIL")
    return t
