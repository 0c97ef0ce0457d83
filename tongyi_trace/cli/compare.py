"""`kvtrace compare RUN_A RUN_B`: two replays side by side (engine hit ratio, simulator, TTFT, plugin)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from tongyi_trace.cli import app, source_value
from tongyi_trace.cli._common import console, print_json, run_cli, say
from tongyi_trace.schemas import COMPARE_SCHEMA

if TYPE_CHECKING:
    from rich.table import Table

    from tongyi_trace.replay.compare import Comparison, ReplaySide


@app.command()
def compare(
    replay_a: Path = typer.Argument(..., help="Replay A: RUN_DIR/replay/NAME, or a run folder with one replay."),
    replay_b: Path = typer.Argument(..., help="Replay B (e.g. the same slice with --eviction wa)."),
    policy: Path | None = typer.Option(None, "--policy-file", "--policy",
                                       help="Policy file for the simulator's WA prediction "
                                            "(default: the one the plugin ran)."),
    output: Path | None = typer.Option(None, "-o", "--out", "--output",
                                       help="Where to write the comparison JSON "
                                            "(default: beside replay A, compare_A_vs_B.json)."),
    confidence: float = typer.Option(source_value("sim.bootstrap", "DEFAULT_CONFIDENCE"), "--confidence",
                                     help="Confidence level of the paired intervals of B - A (block bootstrap "
                                          "over sessions)."),
    json_out: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No table."),
) -> None:
    """Engine hit ratio, simulator predictions (LRU, WA), TTFT and plugin counters of two replays."""
    from tongyi_trace.replay.compare import compare_replays

    comp = run_cli(lambda: compare_replays(replay_a, replay_b, policy=policy, output=output,
                                           confidence=confidence))
    if json_out:
        print_json(comp.to_json(), COMPARE_SCHEMA)
    elif not quiet:
        console.print(_table(comp))
        for line in _interval_lines(comp):
            say(line)
        for side in (comp.a, comp.b):
            for note in side.notes:
                say((f"{side.name}: {note}", "dim"))
        for note in comp.notes:
            say(("note:", "yellow"), f" {note}")
        say("written to ", (str(comp.output_path), "bold"))


def _interval_lines(comp: Comparison) -> list[str]:
    """B against A with the paired intervals: '+x.xx +- y.yy points' and the mean TTFT change in percent."""
    iv = comp.intervals
    if iv is None:
        return []
    level = f"{100 * iv.confidence:g}%"
    how = f"{level} interval, paired bootstrap over {iv.num_groups:,} {iv.resampled} of {iv.num_paired:,} requests"
    out = []
    h = iv.engine_hit_ratio_pp
    if h is not None:
        out.append(f"engine hit ratio B - A: {h.text()} points [{h.lo:+.2f}, {h.hi:+.2f}] ({how})")
    t = iv.ttft_mean_change_pct
    if t is not None:
        out.append(f"TTFT mean B vs A: {t.text('+.1f')}% [{t.lo:+.1f}%, {t.hi:+.1f}%] ({how})")
    return out


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _pp(x: Any) -> str:
    return "-" if x is None else f"{100 * x:+.2f} pp"


def _ms(x: Any, sign: bool = False) -> str:
    return "-" if x is None else (f"{x:+.1f}" if sign else f"{x:.1f}")


def _num(x: Any, spec: str = ",") -> str:
    return "-" if x is None else format(x, spec)


def _plugin(side: ReplaySide, key: str) -> Any:
    return None if side.plugin is None else side.plugin.get(key)


def _table(comp: Comparison) -> Table:
    from rich.table import Table

    from tongyi_trace.replay.compare import SIM_POLICIES

    a, b, d = comp.a, comp.b, comp.diff
    t = Table(title="replays side by side")
    t.add_column("")
    for col in (f"A: {a.name}", f"B: {b.name}", "B - A"):
        t.add_column(col, justify="right")
    t.add_row("eviction", a.eviction, b.eviction, "")
    t.add_row("requests", _num(a.num_requests), _num(b.num_requests), "")
    t.add_row("engine blocks", _num(a.num_gpu_blocks), _num(b.num_gpu_blocks), "")
    t.add_row("engine hit ratio", _pct(a.engine_hit_ratio), _pct(b.engine_hit_ratio), _pp(d["engine_hit_ratio"]))
    for pol in SIM_POLICIES:
        t.add_row(f"simulator {pol.upper()}", _pct(a.predicted_hit_ratio[pol]), _pct(b.predicted_hit_ratio[pol]),
                  _pp(d[f"predicted_{pol}_hit_ratio"]))
    for q in ("mean", "p50", "p99"):
        t.add_row(f"TTFT {q} ms", _ms(a.ttft_ms[q]), _ms(b.ttft_ms[q]), _ms(d[f"ttft_{q}_ms"], sign=True))
    t.add_row("plugin evictions", _num(_plugin(a, "evictions")), _num(_plugin(b, "evictions")), "")
    t.add_row("decision mean us", _num(_plugin(a, "decision_mean_us"), ".2f"),
              _num(_plugin(b, "decision_mean_us"), ".2f"), "")
    t.add_row("decision P99 us", _num(_plugin(a, "decision_p99_us"), ".2f"),
              _num(_plugin(b, "decision_p99_us"), ".2f"), "")
    t.add_row("plugin fallbacks", _num(_plugin(a, "fallbacks")), _num(_plugin(b, "fallbacks")), "")
    return t
