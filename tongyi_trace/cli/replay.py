"""`kvtrace replay RUN_DIR --server URL`: live replay against a vLLM server, with reconciliation."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from tongyi_trace.cli import app, source_value
from tongyi_trace.cli._common import console, err_console, live_console, print_json, run_cli, say
from tongyi_trace.errors import UsageError
from tongyi_trace.schemas import REPLAY_SCHEMA
from tongyi_trace.stops import stop_exit_code

if TYPE_CHECKING:
    from rich.progress import TaskID

    from tongyi_trace.replay.dispatch import DispatchState
    from tongyi_trace.replay.runner import ReplayOptions, ReplayResult, ServerInfo
    from tongyi_trace.replay.schedule import Schedule


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.2f}%"
    return f"{v:,.1f}" if isinstance(v, float) else f"{v:,}"


def _render(res: ReplayResult) -> None:
    from rich.table import Table

    s = res.summary
    c = s.get("counts") or {}
    cancelled = f" ({c['num_cancelled']} in flight at the stop, cancelled)" if c.get("num_cancelled") else ""
    say("replay ", (str(s.get("name")), "bold"), f" {s.get('status')}: {c.get('num_ok', 0)} ok, "
        f"{c.get('num_error', 0)} failed, {c.get('num_not_finished', 0)} not finished{cancelled} "
        f"in {s.get('wall_s') or 0:.1f} s -> {res.out_dir}")
    retried = s.get("retries") or {}
    if retried.get("num_retries"):
        say(f"{retried['num_requests']} requests retried after HTTP 429/503 ({retried['num_retries']} retries, "
            f"{retried['wait_s']:.1f} s waited as the server's Retry-After asked)")
    t = Table(title="hit ratio (tokens)", show_header=True)
    t.add_column("source")
    t.add_column("hit ratio", justify="right")
    t.add_row("engine /metrics delta", _fmt((s.get("metrics") or {}).get("hit_ratio"), pct=True))
    t.add_row("engine cached_tokens (records)", _fmt(s.get("records_hit_ratio"), pct=True))
    rec = s.get("reconciliation")
    if rec and "predicted_hit_ratio" in rec:
        pol = str(rec.get("predicted_policy", "lru"))
        t.add_row(f"simulator {pol.upper()} at engine capacity", _fmt(rec["predicted_hit_ratio"], pct=True))
        t.add_row("trace ideal (unlimited cache)", _fmt(rec["ideal_hit_ratio"], pct=True))
    console.print(t)
    if rec and "exact_share" in rec:
        console.print(f"engine == simulator for {100 * rec['exact_share']:.1f}% of requests; mean |gap| "
                      f"{rec['mean_abs_gap_tokens']:.1f} tokens; engine - simulator "
                      f"{rec['engine_minus_predicted_pp']:+.2f} pp", highlight=False)
        if rec.get("predicted_policy_note"):
            console.print(f"note: {rec['predicted_policy_note']}", highlight=False)
    elif s.get("reconciliation_note"):
        console.print(f"reconciliation skipped: {s['reconciliation_note']}", highlight=False)
    if rec and rec.get("per_instance"):
        fleet = Table(title=f"per engine (router {(s.get('fleet') or {}).get('router', '?')})")
        for col in ("engine", "server", "routed", "ok", "engine hit", "fleet simulator", "engine == simulator"):
            fleet.add_column(col, justify="left" if col == "server" else "right")
        for inst in rec["per_instance"]:
            exact = inst.get("exact_share")
            fleet.add_row(str(inst["instance"]), str(inst["server"]), str(inst["num_routed"]), str(inst["num_ok"]),
                          _fmt(inst.get("engine_hit_ratio"), pct=True),
                          _fmt(inst.get("fleet_predicted_hit_ratio"), pct=True),
                          "-" if exact is None else f"{100 * exact:.1f}%")
        console.print(fleet)
    lat = Table(title="latency (ms)")
    for col in ("", "p50", "p90", "p99", "max"):
        lat.add_column(col, justify="right")
    for key in ("ttft_ms", "e2e_ms", "drift_ms", "held_ms"):
        d = s.get(key) or {}
        lat.add_row(key.removesuffix("_ms"), *(_fmt(d.get(k)) for k in ("p50", "p90", "p99", "max")))
    console.print(lat)
    vocab = s.get("vocab") or {}
    if str(vocab.get("source", "")).startswith("default"):
        say(("note:", "yellow"), f" token ids drawn below {vocab.get('source')}")
    if s.get("num_cached_over_prompt"):
        say(("warning:", "yellow"), f" {s['num_cached_over_prompt']} requests report more cached tokens than "
            "their prompt; the server's cached_tokens is not trustworthy")
    for e in s.get("errors", [])[:5]:
        say((f"{e['count']} x", "red"), f" {e['error']}")


def _render_sweep(doc: dict[str, Any], path: Path) -> None:
    """The sweep as vllm bench serve prints it: a row per load point."""
    from rich.table import Table

    from tongyi_trace.report.fmt import quantity

    kind = str(doc.get("kind"))
    slo = doc.get("slo") or {}
    unit = "req/s" if kind == "rate" else "in flight"
    t = Table(title=f"load sweep {doc.get('name')} ({kind}, {doc.get('status')})")
    for col in (f"{kind} ({unit})", "ok / failed", "req/s", "output tok/s", "TTFT mean / median / P99 ms",
                "TPOT mean / median / P99 ms", "ITL mean / median / P99 ms", "goodput req/s"):
        t.add_column(col, justify="right")
    for r in doc.get("rows") or []:
        def three(key: str, row: dict[str, Any] = r) -> str:
            d = row.get(key) or {}
            return " / ".join(quantity(d.get(k)) for k in ("mean", "median", "p99"))

        good = (f"{quantity(r.get('goodput_per_s'))} ({r.get('num_good')} of {r.get('num_ok')})" if slo
                else "-")
        t.add_row(f"{r.get(kind):g}", f"{r.get('num_ok')} / {r.get('num_error')}", quantity(r.get("requests_per_s")),
                  quantity(r.get("output_tokens_per_s")), three("ttft_ms"), three("tpot_ms"), three("itl_ms"), good)
    console.print(t)
    slo_text = ", ".join(f"{k} <= {v:g}" for k, v in slo.items())
    say(f"goodput: requests/s that finished within {slo_text}" if slo else
        "goodput: give --slo ttft_ms=...,tpot_ms=... to count the requests within SLOs", f"; -> {path}")


@app.command()
def replay(
    run_dir: Path = typer.Argument(..., help="Run folder from 'kvtrace ingest'."),
    server: str | None = typer.Option(None, "--server", help="Base URL of a vLLM OpenAI-compatible server, or "
                                      "several comma-separated (a fleet replay: give --router)."),
    router: str | None = typer.Option(None, "--router", help="Several servers: the fleet router that picks each "
                                      "request's engine (rr, least-loaded, session, prefix, kv-aware, "
                                      "oracle-affinity; as 'kvtrace simulate --router')."),
    model: str | None = typer.Option(None, "--model", help="Served model name (default: the server's first)."),
    name: str = typer.Option("default", "--name", help="Artifacts go to RUN_DIR/replay/NAME/."),
    speedup: float = typer.Option(1.0, "--speedup", help="Divide the trace's inter-arrival times by this."),
    start_s: float = typer.Option(0.0, "--start",
                                  help="Replay arrivals from this second on, counted from the trace's first request."),
    duration_s: float | None = typer.Option(None, "--duration", help="Replay this many trace seconds."),
    max_requests: int | None = typer.Option(None, "--max-requests", help="Send at most this many requests."),
    sample_sessions: float | None = typer.Option(None, "--sample-sessions",
                                                 help="Keep this fraction of whole sessions (0-1]."),
    closed_sessions: bool = typer.Option(False, "--closed-sessions",
                                         help="A child request waits until its parent has finished."),
    max_output: int | None = typer.Option(None, "--max-output", help="Cap each request's output tokens."),
    max_in_flight: int | None = typer.Option(None, "--max-in-flight",
                                             help="Cap on concurrent requests (1 = one at a time)."),
    vocab_size: int | None = typer.Option(None, "--vocab-size", help="Token ids are drawn below this (the "
                                          "model's ordinary tokens; default: what the server says, else "
                                          f"{source_value('engine.model', 'VOCAB_SIZE'):,})."),
    min_token_id: int = typer.Option(source_value("replay.prompts", "DEFAULT_MIN_TOKEN_ID"), "--min-token-id",
                                     help="Lowest token id used (keeps clear of BOS/EOS/pad)."),
    seed: int = typer.Option(0, "--seed", help="Seed of prompt synthesis and session sampling."),
    api_key_env: str | None = typer.Option(None, "--api-key-env",
                                           help="Name of the environment variable holding the API key."),
    timeout_s: float = typer.Option(600.0, "--request-timeout-s", help="Per-request timeout."),
    max_retries: int = typer.Option(3, "--max-retries", help="Re-send a request the server answers HTTP 429 or "
                                    "503 at most this often, after the delay its Retry-After asks (at most "
                                    "60 s; without one 1 s, doubling); 0: never."),
    engine_block_size: int | None = typer.Option(None, "--engine-block-size",
                                                 help="Engine block size when /metrics does not say."),
    engine_num_blocks: int | None = typer.Option(None, "--engine-num-blocks",
                                                 help="Engine KV blocks when /metrics does not say."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing replay of this name."),
    reset_cache: bool = typer.Option(False, "--reset-cache", help="Empty the server's prefix cache first "
                                     "(POST /reset_prefix_cache; needs VLLM_SERVER_DEV_MODE=1)."),
    plugin_stats: Path | None = typer.Option(None, "--plugin-stats", help="The WA plugin's plugin_stats.json "
                                             "(default: found for a local 'kvtrace engine')."),
    policy_file: Path | None = typer.Option(None, "--policy-file", help="Tag each request (kv_category) as this "
                                            "policy file's categories (default: RUN/fit/policy.json if present)."),
    reconcile_only: bool = typer.Option(False, "--reconcile-only", help="Only recompute the reconciliation "
                                        "of replay NAME from its records (no server needed)."),
    sweep: str | None = typer.Option(None, "--sweep", help="A load sweep, one replay per point (NAME-rate4, ...): "
                                     "rate=1,2,4,8 (requests/s: the trace's arrival pattern scaled to each mean "
                                     "rate) or concurrency=1,4,16 (requests in flight, all due at once); the table "
                                     "goes to RUN/replay/NAME/sweep.json and the report."),
    slo: str | None = typer.Option(None, "--slo", help="With --sweep: the goodput SLOs in ms, ttft_ms=500,"
                                   "tpot_ms=50 (and e2e_ms): goodput = requests/s meeting every one."),
    json_out: bool = typer.Option(False, "--json", help="Print summary.json (with --sweep: sweep.json) on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar, no tables."),
) -> None:
    """Replay a trace against a live vLLM server and reconcile its cache hits with the simulator."""

    from tongyi_trace.replay.runner import ReplayOptions, run_replay
    from tongyi_trace.replay.runner import reconcile_only as reconcile_only_fn
    from tongyi_trace.replay.schedule import ScheduleOptions

    def build() -> ReplayOptions:
        if not math.isfinite(speedup):  # the core takes inf (a closed-loop load point); a user gives a load sweep
            raise UsageError(f"--speedup {speedup} must be a finite number > 0 (every request at once: "
                             "--sweep concurrency=N)")
        if server is None and not reconcile_only:
            raise UsageError("--server URL is required (e.g. the URL 'kvtrace engine start' printed)")
        api_key = None
        if api_key_env is not None:
            api_key = os.environ.get(api_key_env)
            if not api_key:
                raise UsageError(f"--api-key-env {api_key_env}: that environment variable is empty or unset")
        return ReplayOptions(
            name=name, model=model, vocab_size=vocab_size, min_token_id=min_token_id, seed=seed,
            max_in_flight=max_in_flight, api_key=api_key, request_timeout_s=timeout_s, max_retries=max_retries,
            engine_block_size=engine_block_size, engine_num_blocks=engine_num_blocks, overwrite=overwrite,
            reset_cache=reset_cache, plugin_stats=plugin_stats, router=router, policy_file=policy_file,
            schedule=ScheduleOptions(speedup=speedup, start_s=start_s, duration_s=duration_s,
                                     max_requests=max_requests, sample_sessions=sample_sessions,
                                     closed_sessions=closed_sessions, max_output_tokens=max_output, seed=seed))

    opts = run_cli(build)
    if sweep is not None or slo is not None:
        _sweep(run_dir, server, opts, sweep, slo, json_out, quiet)
        return
    if reconcile_only:
        res = run_cli(lambda: reconcile_only_fn(run_dir, name))
        if json_out:
            print_json(res.summary, REPLAY_SCHEMA)
        elif not quiet:
            _render(res)
        return
    assert server is not None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}", style="progress.description", markup=False), BarColumn(),
                   MofNCompleteColumn(),
                   TextColumn("sent {task.fields[sent]} errors {task.fields[errors]} hit {task.fields[hit]}"),
                   TimeElapsedColumn(), console=live_console(),
                   disable=quiet or json_out or not err_console.is_interactive, transient=True)
    task: list[TaskID] = []

    def on_start(sched: Schedule, info: ServerInfo) -> None:
        bar.start()  # only once the replay has started: an option error stays a single line
        task.append(bar.add_task(f"replay -> {info.model}", total=len(sched.requests), sent=0, errors=0,
                                 hit="-"))

    def on_update(st: DispatchState) -> None:
        if task:
            hr = st.hit_ratio
            bar.update(task[0], completed=st.num_done, sent=st.num_sent, errors=st.num_errors,
                       hit="-" if hr is None else f"{100 * hr:.1f}%")

    try:
        res = run_cli(lambda: run_replay(run_dir, server, opts, on_start=on_start, on_update=on_update))
    finally:
        if bar.live.is_started:
            bar.stop()
    if json_out:
        print_json(res.summary, REPLAY_SCHEMA)
    elif not quiet:
        _render(res)
    if res.summary["status"] == "failed":  # every request failed: said even with -q, and a failing exit
        say(("failed", "red"), f": {res.summary.get('error')}; the records are in {res.out_dir / 'records.jsonl'}",
            err=True)
        raise typer.Exit(1)
    if res.summary["status"] == "interrupted":
        say(("interrupted", "yellow"), f": {res.summary.get('error') or 'Ctrl-C'}; every request sent is in "
            "records.jsonl (those cut off: status cancelled)", err=True)
        raise typer.Exit(stop_exit_code(res.summary.get("error")))


def _sweep(run_dir: Path, server: str | None, opts: ReplayOptions, sweep: str | None, slo: str | None,
           json_out: bool, quiet: bool) -> None:
    """`--sweep`: one replay per load point, a line per finished point, then the table."""
    from tongyi_trace.replay.sweep import parse_slo, parse_sweep, run_sweep
    from tongyi_trace.schemas import SWEEP_SCHEMA

    def check() -> tuple[Any, dict[str, float]]:
        if sweep is None:
            raise UsageError("--slo goes with --sweep (e.g. --sweep rate=1,2,4 --slo ttft_ms=500,tpot_ms=50)")
        if server is None:
            raise UsageError("--server URL is required (e.g. the URL 'kvtrace engine start' printed)")
        return parse_sweep(sweep), parse_slo(slo)

    spec, slos = run_cli(check)
    assert server is not None

    def on_point(kind: str, value: float, res: ReplayResult) -> None:
        if not quiet and not json_out:
            t = res.summary.get("throughput") or {}
            from tongyi_trace.report.fmt import quantity

            say(f"{kind} {value:g}: {res.summary.get('status')}, {(res.summary.get('counts') or {}).get('num_ok', 0)} "
                f"ok, {quantity(t.get('requests_per_s'))} req/s -> {res.out_dir}", err=True)

    out = run_cli(lambda: run_sweep(run_dir, server, opts, spec, slos, on_point=on_point))
    if json_out:
        print_json(out.doc, SWEEP_SCHEMA)
    elif not quiet:
        _render_sweep(out.doc, out.path)
    if out.doc.get("status") == "interrupted":
        raise typer.Exit(stop_exit_code(out.doc.get("error")))
