"""Shared CLI plumbing: the console, error mapping, JSON output and progress bars.

Both consoles have Rich markup and emoji codes OFF: user and server text (file names, trace values,
server error bodies) is printed verbatim and can never be read as markup. Style a fixed part of a line
with `say(("error:", "bold red"), " ", text)`; table cells are likewise plain text. They are built on first
use: rich.console is not imported by `kvtrace CMD --help` (bench/bench_cli.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import typer

from tongyi_trace.errors import KvtraceError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress


# output to a file or pipe (no terminal, no COLUMNS): tables at their natural width and messages on one line
# each, not cut or wrapped at Rich's default of 80 columns
REDIRECTED_WIDTH = 1000


class _DeferredConsole:
    """A Rich Console (markup and emoji off) created on its first attribute access."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def get(self) -> Console:
        """The Console itself, created now if needed."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=self._stderr, markup=False, emoji=False)
            if not self._console.is_terminal and "COLUMNS" not in os.environ:
                self._console.width = REDIRECTED_WIDTH
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)


if TYPE_CHECKING:
    console: Console
    err_console: Console
else:
    console = _DeferredConsole(stderr=False)
    err_console = _DeferredConsole(stderr=True)


def live_console() -> Console:
    """The stderr Console itself, for Rich's Progress and Live (which need more than its methods)."""
    return cast(Any, err_console).get()
T = TypeVar("T")
Part = str | tuple[str, str]


def say(*parts: Part, err: bool = False) -> None:
    """Print one line built from PARTS: a str verbatim, a (text, style) tuple in that Rich style."""
    from rich.text import Text

    line = Text()
    for p in parts:
        if isinstance(p, str):
            line.append(p)
        else:
            line.append(p[0], style=p[1])
    (err_console if err else console).print(line, highlight=False, soft_wrap=True)


def run_cli(fn: Callable[[], T]) -> T:
    """Call FN; turn a KvtraceError into its one-line message and exit code (no traceback). SIGTERM and
    SIGHUP stop FN like Ctrl-C, so its cleanup runs (temporary files removed, summaries finalized). The first
    compile of a kernel says so on stderr, even with -q (tongyi_trace/compile_notice.py: a stall of a minute
    must not look like a hang; stdout, and so --json, stays clean)."""
    from tongyi_trace.compile_notice import notify_first_compile
    from tongyi_trace.stops import stop_exit_code, stop_signals_interrupt

    notify_first_compile(lambda notice: say((notice, "yellow"), err=True))

    try:
        with stop_signals_interrupt():
            return fn()
    except KvtraceError as e:
        say(("error:", "bold red"), " ", " ".join(str(e).split()), err=True)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt as e:
        say(("interrupted", "yellow"), f"{f' ({e})' if str(e) else ''}: results written so far are kept", err=True)
        raise typer.Exit(stop_exit_code(e)) from None


GENERIC_SCHEMA = "kvtrace.output/1"  # only for callers that do not name their document's schema yet


def print_json(obj: dict[str, Any], schema: str = GENERIC_SCHEMA) -> None:
    """Print OBJ as strict JSON on stdout (machine-readable output for --json; NaN becomes null), its
    "schema" key first (SCHEMA unless OBJ carries its own; docs/artifacts/cli-json.md)."""
    from tongyi_trace.atomic import json_text

    sys.stdout.write(json_text({"schema": obj.get("schema", schema), **obj}))


def abs_path(p: str | Path | None) -> str | None:
    """P as an absolute path string (None stays None): paths in --json output are absolute."""
    return None if p is None else str(Path(p).resolve())


@contextmanager
def progress(quiet: bool = False, unit: str = "items") -> Iterator[Progress]:
    """A Rich progress bar on stderr, disabled with --quiet or --json and when stderr is not a terminal
    (a log would only get the blank line Rich prints in its place). UNIT "bytes" shows the counts as sizes
    (12.3/45.6 MB), "items" as N/M."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(
        TextColumn("{task.description}", style="progress.description", markup=False),
        BarColumn(),
        DownloadColumn() if unit == "bytes" else MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=live_console(),
        disable=quiet or not err_console.is_interactive,
        transient=True,
    ) as p:
        yield p


def run_or_trace(path: Path) -> Any:
    """The RunDir at PATH, or a raw trace at PATH ingested once into ./<trace name>.kvtrace (a missing path
    gives the run folder's error, which says how to make one)."""
    from tongyi_trace.run import open_run
    from tongyi_trace.trace.ingest import ensure_run

    return ensure_run(path) if path.exists() else open_run(path)
