"""`kvtrace analyze`: run the characterization analyses (paper section 3) over a run folder or a trace."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from tongyi_trace.budget import resolve_budget
from tongyi_trace.cli import app, source_keys
from tongyi_trace.cli._common import abs_path, console, print_json, progress, run_cli, say
from tongyi_trace.schemas import ANALYSIS_SCHEMA

if TYPE_CHECKING:
    from rich.table import Table

    from tongyi_trace.analysis import AnalysisReport
    from tongyi_trace.executor import PartitionOptions


@app.command()
def analyze(
    trace_or_run: Path = typer.Argument(..., help="Run folder from 'kvtrace ingest', or a raw trace (ingested first)."),
    out: Path | None = typer.Option(None, "-o", "--out", help="Run folder to ingest a raw trace into "
                                    "(default: ./<trace name>.kvtrace)."),
    only: str | None = typer.Option(None, "--only", help="Comma-separated subset of: "
                                    f"{', '.join(source_keys('analysis.runner', 'ANALYSES'))}."),
    model: str = typer.Option("qwen2-7b,llama2-13b,llama3-70b", "--model",
                              help="Comma-separated models for KV bytes and HBM: presets (qwen2-7b, llama2-13b, "
                                   "llama3-70b), Hugging Face config.json paths, or 'custom' with the shape "
                                   "options."),
    layers: int | None = typer.Option(None, "--layers", help="Override: transformer layers."),
    kv_heads: int | None = typer.Option(None, "--kv-heads", help="Override: KV heads."),
    head_dim: int | None = typer.Option(None, "--head-dim", help="Override: head dimension."),
    dtype_bytes: int | None = typer.Option(None, "--dtype-bytes", help="Override: bytes per KV element, e.g. 2 for "
                                             "bf16/fp16, 1 for fp8 (default: the model's own)."),
    params_b: float | None = typer.Option(None, "--params-b", help="Override: parameters in billions (weights)."),
    tp: int | None = typer.Option(None, "--tp", help="Override: tensor-parallel degree (GPUs)."),
    gpu_mem_gib: float | None = typer.Option(None, "--gpu-mem", "--gpu-mem-gib",
                                             help="Override: memory per GPU in GiB (80)."),
    reserve_gib: float | None = typer.Option(None, "--reserve-gib",
                                             help="Override: activation reserve per GPU in GiB (2)."),
    gpu_util: float | None = typer.Option(None, "--gpu-util", help="Override: usable share of GPU memory (0.9)."),
    top_n: int = typer.Option(20, "--top-n", help="Users (or sessions) shown in the producer x consumer heatmap."),
    window_s: float = typer.Option(600.0, "--window-s", help="Window of the next-turn probability, seconds."),
    memory_limit_gib: float | None = typer.Option(None, "--memory-limit-gib",
                                                  help="Memory budget of the whole process, GiB (default: a "
                                                       "quarter of this machine's, at most 6); DuckDB gets half "
                                                       "of what the interpreter leaves and spills to the run folder "
                                                       "beyond it."),
    threads: int = typer.Option(2, "--threads", help="DuckDB threads."),
    executor: str = typer.Option("local", "--executor", help="Where the per-block work runs: local (this process; "
                                 "the local process pool with --partitions) or ray (a Ray cluster, in partitions "
                                 "by a hash of the chained block id; pip install 'kvtrace[ray]'). Same artifacts."),
    ray_address: str | None = typer.Option(None, "--ray-address", "--address", metavar="ADDR",
                                           help="Ray cluster to use (default: $RAY_ADDRESS, else start a local "
                                                "Ray instance)."),
    partitions: int | None = typer.Option(None, "--partitions", help="Partitions of the per-block work, one task "
                                          "each (default with --executor ray: 16; locally: none)."),
    report: bool = typer.Option(False, "--report", help="Also write RUN_DIR/report.html."),
    json_out: bool = typer.Option(False, "--json", help="Print every headline figure as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary table."),
) -> None:
    """Compute every analysis of the paper's characterization and write them into RUN_DIR/analysis/.

    Example: kvtrace analyze ../shared/traces/mooncake_conversation.jsonl -o runs/conv --only hit_ratio
    """

    def go() -> tuple[AnalysisReport, str | None]:
        from tongyi_trace.analysis import AnalysisOptions, parse_only, resolve_models, run_analyses
        from tongyi_trace.trace.ingest import ensure_run

        models = resolve_models(
            [m.strip() for m in model.split(",") if m.strip()], num_layers=layers, num_kv_heads=kv_heads,
            head_dim=head_dim, dtype_bytes=dtype_bytes, params_b=params_b, gpu_mem_gib=gpu_mem_gib, tp=tp,
            reserve_gib=reserve_gib, utilization=gpu_util)
        opts = AnalysisOptions(models=models, top_n=top_n, window_s=window_s,
                               memory_limit_gib=budget.duckdb_gib, threads=threads)
        split = _partition_options(executor, ray_address, partitions)
        run = ensure_run(trace_or_run, out)
        with progress(quiet or json_out) as bar:
            task = bar.add_task("analyzing", total=len(parse_only(only)))
            parts: list[Any] = []

            def on_partition(done: int, total: int) -> None:
                if not parts:
                    parts.append(bar.add_task("per-block partitions", total=total))
                bar.update(parts[0], completed=done)

            rep = run_analyses(run, only=only, options=opts, on_done=lambda r: bar.advance(task), partitions=split,
                               on_partition=on_partition)
        html = None
        if report:
            from tongyi_trace.report import render_report

            html = str(render_report(run))
        return rep, html

    budget = run_cli(lambda: resolve_budget(memory_limit_gib))
    rep, html = run_cli(go, budget)
    summary = rep.summary()
    if json_out:
        print_json({**summary, "run": abs_path(str(summary.get("run", rep.run.path))), "report": abs_path(html)},
                   ANALYSIS_SCHEMA)
        return
    if quiet:
        return
    console.print(_table(rep))
    for name, r in rep.results.items():
        if not r.ok:
            say((f"{name} absent", "yellow"), f": {r.reason}")
        for part, why in r.absent_parts.items():
            say((f"{name}.{part} absent", "yellow"), f": {why}")
    say("artifacts: ", (str(rep.out_dir), "bold"), f" ({rep.elapsed_s:.1f} s)")
    if html:
        say("report: ", (html, "bold"))


def _partition_options(executor: str, ray_address: str | None, partitions: int | None) -> PartitionOptions | None:
    """The partitioning --executor, --ray-address and --partitions ask for (None: the local run as is)."""
    from tongyi_trace.executor import (
        DEFAULT_PARTITIONS,
        ExecutorOptions,
        PartitionOptions,
        check_options,
        check_partitions,
    )

    opts = check_options(ExecutorOptions(executor, ray_address))
    if partitions is None:
        return PartitionOptions(opts, DEFAULT_PARTITIONS) if opts.kind == "ray" else None
    return PartitionOptions(opts, check_partitions(partitions))


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _headlines(name: str, h: dict[str, Any]) -> list[tuple[str, Any]]:
    """The few figures of each analysis worth a line in the terminal summary."""
    picks: dict[str, list[str]] = {
        "hit_ratio": ["hit_ratio", "token_hit_ratio", "content_hit_ratio"],
        "request_mix": ["multi_turn_share", "conversation_turns_p50", "conversation_turns_p90", "turn_max",
                        "top10_turn_ratio"],
        "turn_hits": ["single_turn_hit_share", "multi_turn_hit_share"],
        "user_heatmap": ["key_kind", "diagonal_share"],
        "skew": ["top10_block_reuse_share", "key_share_for_90pct_hits"],
        "next_turn": ["single_turn_next_prob", "multi_turn_next_prob", "next_turn_prob"],
        "reuse_time": ["share_within_10s", "share_within_600s", "mean_reuse_time_after_600s_s", "reuse_prob"],
        "spatial": ["head_50pct_hit_ratio", "tail_50pct_hit_ratio"],
        "lifespan": ["p50_s", "p90_s", "p99_s"],
        "live_set": ["peak_live_blocks"],
    }
    out = [(k, h.get(k)) for k in picks.get(name, []) if k in h]
    models = h.get("models") or {}
    for m, rec in list(models.items())[:3]:
        if name == "kv_size":
            out.append((f"{m} p99 x HBM", rec.get("total_p99_x_hbm")))
        elif name == "live_set":
            out.append((f"{m} peak x HBM", rec.get("peak_x_hbm")))
    return out


def _table(rep: AnalysisReport) -> Table:
    from rich.table import Table
    from rich.text import Text

    t = Table(title=f"kvtrace analyze: {rep.run.path}")
    t.add_column("analysis (paper figure)")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for name, r in rep.results.items():
        label = f"{name} ({r.figure})"
        if not r.ok:
            t.add_row(label, Text("absent (see below)", style="yellow"), "-")
            continue
        rows = _headlines(name, r.headline) or [("", "")]
        for i, (k, v) in enumerate(rows):
            t.add_row(label if i == 0 else "", k, _fmt(v))
    return t
