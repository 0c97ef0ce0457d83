"""`kvtrace synth`: write a synthetic Qwen-Bailian trace (a paper profile, or `--like` a fitted policy)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from tongyi_trace.cli import app
from tongyi_trace.cli._common import console, print_json, progress, run_cli
from tongyi_trace.errors import UsageError
from tongyi_trace.trace.synth import PROFILES, SynthSummary, synth_to_file


@app.command()
def synth(
    out: Path = typer.Option(..., "-o", "--out", help="Output JSONL (.gz/.zst compress by suffix)."),
    profile: str = typer.Option(None, "--profile", help=f"Paper profile: {' or '.join(PROFILES)} "
                                "(trace A chatbot / trace B API)."),
    like: Path = typer.Option(None, "--like", help="A kvtrace.policy/1 file from 'kvtrace fit': follow its "
                              "per-category reuse, request mix and lengths."),
    seed: int = typer.Option(0, "--seed", help="Random seed: the same seed gives a byte-identical file."),
    requests: int = typer.Option(None, "--requests", help="Number of requests (default 43,000; --like: "
                                 "the fitted trace's)."),
    duration: float = typer.Option(None, "--duration", help="Trace length in seconds (default 7,200; "
                                   "--like: the fitted trace's)."),
    scale: float = typer.Option(1.0, "--scale", help="Multiply the number of requests (and users) by X."),
    json_out: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Generate a synthetic trace in the Qwen-Bailian JSONL format, deterministic for a seed.

    Examples: kvtrace synth --profile to-c --seed 1 -o toc.jsonl;
    kvtrace synth --like policy.json --seed 1 -o like.jsonl.zst
    """
    def go() -> SynthSummary:
        if (profile is None) == (like is None):
            raise UsageError("give exactly one of --profile to-c|to-b or --like policy.json")
        with progress(quiet or json_out) as bar:
            bar.add_task("generating", total=None)
            if like is not None:
                from tongyi_trace.trace.synth_like import synth_like_to_file

                return synth_like_to_file(like, seed, out, requests, duration, scale)
            return synth_to_file(profile, seed, out, requests, duration, scale)

    summary = run_cli(go)
    if json_out:
        print_json(summary.to_json())
        return
    if quiet:
        return
    t = Table(title=f"synthetic {summary.profile} trace -> {summary.path}", show_header=False)
    for k, v in summary.to_json().items():
        if k in ("path", "profile"):
            continue
        if isinstance(v, dict):
            v = ", ".join(f"{a} {b:.1%}" for a, b in v.items())
        t.add_row(k, f"{v:,.3f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v))
    console.print(t)
