"""`kvtrace capture`: a reverse proxy in front of an OpenAI-compatible server that records a privacy-safe trace."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import typer

from tongyi_trace.cli import app
from tongyi_trace.cli._common import abs_path, print_json, run_cli, say


@app.command()
def capture(
    upstream: str = typer.Option(..., "--upstream", help="Base URL of the vLLM, SGLang or other OpenAI-compatible "
                                 "server to put the proxy in front of, e.g. http://127.0.0.1:8000."),
    output: Path = typer.Option(..., "-o", "--out", "--output", help="The trace to write: OUT.jsonl, "
                                "OUT.jsonl.gz or OUT.jsonl.zst (Qwen-Bailian lines; `kvtrace ingest` reads it)."),
    listen: str = typer.Option("127.0.0.1:0", "--listen", help="HOST:PORT the proxy listens on (port 0: a free "
                               "one); its URL is the first line printed."),
    block_size: int = typer.Option(16, "--block-size", help="Tokens per hashed block (the Qwen-Bailian traces' 16)."),
    salt_file: Path | None = typer.Option(None, "--salt-file", help="Keep the hashing key in this file (created "
                                          "when absent, mode 0600) so that captures sharing it give the same ids "
                                          "to the same blocks (ids are then 63-bit hashes, not dense); default: "
                                          "a random key per capture, never written."),
    tokenizer: Path | None = typer.Option(None, "--tokenizer", help="A local tokenizer.json (the served model's, "
                                          "with its tokenizer_config.json beside it) for prompts given as text; "
                                          "default: the upstream's /tokenize."),
    drain_s: float = typer.Option(5.0, "--drain-s", help="At a stop, how long requests in flight may still "
                                  "finish (those cut are counted as skipped)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing OUT file."),
    json_out: bool = typer.Option(False, "--json", help="After the URL line, print the summary at the stop as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the URL."),
) -> None:
    """Proxy /v1/completions and /v1/chat/completions (and every other path, unchanged) to --upstream and
    write one Qwen-Bailian line per finished request: timing, lengths, type, turn, keyed block hashes; no
    text, token id or user identifier. Runs until Ctrl-C or SIGTERM, then closes the file complete."""
    from tongyi_trace.capture.proxy import CaptureOptions, parse_listen, run_capture

    def ready(url: str) -> None:
        sys.stdout.write(url + "\n")
        sys.stdout.flush()
        if not quiet and not json_out:
            say("capturing ", (upstream, "bold"), " into ", (str(output), "bold"), "; Ctrl-C to stop", err=True)

    def go() -> object:
        host, port = parse_listen(listen)
        opts = CaptureOptions(upstream_url=upstream, out_path=output, listen_host=host, listen_port=port,
                              block_size_tokens=block_size, salt_file=salt_file, tokenizer_file=tokenizer,
                              overwrite=overwrite, drain_s=drain_s)
        return run_capture(opts, ready)

    from tongyi_trace.capture.proxy import CaptureSummary

    s = run_cli(go)
    assert isinstance(s, CaptureSummary)
    if json_out:
        print_json({**asdict(s), "out_path": abs_path(s.out_path)}, "kvtrace.capture-summary/1")
    elif not quiet:
        say(("recorded", "bold green"), f" {s.num_recorded} requests into {s.out_path} ({s.num_distinct_blocks} "
            f"distinct blocks of {s.block_size} tokens) in {s.duration_s:.1f} s; errors {s.num_errors}, "
            f"skipped {s.num_skipped}, other paths forwarded {s.num_passthrough}", err=True)
        for kind, table in (("error", s.errors), ("skipped", s.skipped)):
            for reason, n in sorted(table.items(), key=lambda kv: -kv[1]):
                say((f"  {kind}:", "yellow"), f" {n} x {reason}", err=True)
        if s.num_input_length_mismatch:
            say(("note:", "yellow"), f" {s.num_input_length_mismatch} recorded requests have a token count other "
                "than the upstream's usage.prompt_tokens: the tokenizer differs from the served model's", err=True)
