"""Shared CLI plumbing: the console, error mapping, JSON output and progress bars.

Both consoles have Rich markup and emoji codes OFF: user and server text (file names, trace values,
server error bodies) is printed verbatim and can never be read as markup. Style a fixed part of a line
with `say(("error:", "bold red"), " ", text)`; table cells are likewise plain text. They are built on first
use: rich.console is not imported by `kvtrace CMD --help` (bench/bench_cli.py).
"""

from __future__ import annotations

import errno
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

    from tongyi_trace.budget import MemoryBudget


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


def run_cli(fn: Callable[[], T], budget: MemoryBudget | None = None) -> T:
    """Call FN; turn a KvtraceError into its one-line message and exit code (no traceback). SIGTERM and
    SIGHUP stop FN like Ctrl-C, so its cleanup runs (temporary files removed, summaries finalized). With a
    BUDGET (`--memory-limit-gib`), FN runs under its watch (tongyi_trace/budget.py), and running out of
    memory is one line naming the step and the option to raise. The first compile of a kernel says so on
    stderr, even with -q (tongyi_trace/compile_notice.py: a stall of a minute must not look like a hang;
    stdout, and so --json, stays clean)."""
    from tongyi_trace.budget import MemoryWatch, out_of_memory
    from tongyi_trace.compile_notice import notify_first_compile
    from tongyi_trace.stops import stop_exit_code, stop_signals_interrupt

    notify_first_compile(lambda notice: say((notice, "yellow"), err=True))

    try:
        with stop_signals_interrupt():
            if budget is None:
                return fn()
            with MemoryWatch(budget):
                return fn()
    except KvtraceError as e:
        say(("error:", "bold red"), " ", " ".join(str(e).split()), err=True)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt as e:
        say(("interrupted", "yellow"), f"{f' ({e})' if str(e) else ''}: results written so far are kept", err=True)
        raise typer.Exit(stop_exit_code(e)) from None
    except Exception as e:  # out of memory or of disk: one line, never a traceback; anything else as it is
        oom = out_of_memory(e, budget)  # MemoryError, DuckDB's OutOfMemoryException
        if oom is not None:
            say(("error:", "bold red"), " ", str(oom), err=True)
            raise typer.Exit(oom.exit_code) from None
        reason = out_of_space(e)  # a disk that fills up (or a file size limit) mid-write
        if reason is None:
            raise
        where = f"{e.filename}: " if isinstance(e, OSError) and e.filename else ""
        say(("error:", "bold red"), f" {where}cannot write ({reason}); the previous results are kept: free space "
            "and run the command again", err=True)
        raise typer.Exit(1) from None


_OUT_OF_SPACE = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                 errno.EFBIG: "file too large for the file system or the file size limit"}


def out_of_space(e: BaseException) -> str | None:
    """Why E is a write that ran out of room (a full disk, a quota, a file size limit), or None: an OSError's
    errno, or the text of a library's error (polars, pyarrow, DuckDB) that wraps one."""
    if isinstance(e, OSError) and e.errno in _OUT_OF_SPACE:
        return _OUT_OF_SPACE[e.errno]
    text = str(e)
    for code, reason in _OUT_OF_SPACE.items():
        if os.strerror(code) in text:
            return reason
    return None


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
def progress(quiet: bool = False, unit: str = "items", log_every_s: float | None = None) -> Iterator[Progress]:
    """A Rich progress bar on stderr, disabled with --quiet or --json and when stderr is not a terminal
    (a log would only get the blank line Rich prints in its place). UNIT "bytes" shows the counts as sizes
    (12.3/45.6 MB), "items" as N/M; then the time spent and the estimate of the time left. LOG_EVERY_S: when
    stderr is not a terminal (and not quiet), a plain line 'description N/M (T s)' at most this often instead,
    so that a log shows the work moving."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    if log_every_s is not None and not quiet and not err_console.is_interactive:
        with _line_progress(log_every_s) as lines:
            yield lines
        return
    with Progress(
        TextColumn("{task.description}", style="progress.description", markup=False),
        BarColumn(),
        DownloadColumn() if unit == "bytes" else MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),  # the estimate of the time left (blank while the total is unknown)
        console=live_console(),
        disable=quiet or not err_console.is_interactive,
        transient=True,
    ) as p:
        yield p


@contextmanager
def _line_progress(every_s: float) -> Iterator[Progress]:
    """A disabled Rich Progress whose update also prints 'description N/M (T s)' on stderr at most every
    EVERY_S seconds (and the last state when it ends)."""
    import time

    from rich.progress import Progress, TaskID

    class LineProgress(Progress):
        last_s = 0.0
        start_s = time.monotonic()

        def update(self, task_id: TaskID, **kw: Any) -> None:
            super().update(task_id, **kw)
            now = time.monotonic()
            if now - self.last_s >= every_s:
                self.last_s = now
                self.say(task_id)

        def say(self, task_id: TaskID) -> None:
            t = self._tasks[task_id]
            total = "?" if t.total is None else f"{t.total:,.0f}"
            print(f"{t.description} {t.completed:,.0f}/{total} ({time.monotonic() - self.start_s:,.0f} s)",
                  file=sys.stderr, flush=True)

    lines = LineProgress(disable=True)
    try:
        yield lines
    finally:
        for task_id in lines.task_ids:
            lines.say(task_id)


def run_or_trace(path: Path) -> Any:
    """The RunDir at PATH, or a raw trace at PATH ingested once into ./<trace name>.kvtrace (a missing path
    gives the run folder's error, which says how to make one)."""
    from tongyi_trace.run import open_run
    from tongyi_trace.trace.ingest import ensure_run

    return ensure_run(path) if path.exists() else open_run(path)
