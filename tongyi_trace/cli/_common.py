"""Shared CLI plumbing: the console, error mapping, JSON output and progress bars."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tongyi_trace.errors import KvtraceError
from tongyi_trace.run import _json_default

console = Console()
err_console = Console(stderr=True)
T = TypeVar("T")


def run_cli(fn: Callable[[], T]) -> T:
    """Call FN; turn a KvtraceError into its one-line message and exit code (no traceback)."""
    try:
        return fn()
    except KvtraceError as e:
        err_console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]: results written so far are kept")
        raise typer.Exit(130) from None


def print_json(obj: Any) -> None:
    """Print OBJ as JSON on stdout (machine-readable output for --json)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")


@contextmanager
def progress(quiet: bool = False) -> Iterator[Progress]:
    """A Rich progress bar on stderr, disabled with --quiet or --json."""
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        disable=quiet,
        transient=True,
    ) as p:
        yield p
