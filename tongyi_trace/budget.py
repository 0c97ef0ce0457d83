"""The memory budget of one kvtrace process (`--memory-limit-gib`): the one place that derives DuckDB's
limit, a sweep's parallelism and the simulator's chunk size from it, and the watch that stops a process
about to exceed it with one line naming the step and the option to raise.

The budget is the ceiling for the whole process (resident memory, DuckDB's buffer pool included). Its
default is a safe share of the machine's memory (DEFAULT_SHARE of MemTotal, at most DEFAULT_MAX_GIB):
several such processes fit one machine. Standard library only (layer 1).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tongyi_trace.errors import KvtraceError, UsageError

GIB = 1 << 30
DEFAULT_SHARE = 0.25  # of the machine's memory
DEFAULT_MAX_GIB = 6.0
MIN_GIB = 0.5  # below this the interpreter and its libraries alone do not fit
DUCKDB_SHARE = 0.5  # of the budget: DuckDB's buffer pool (it spills beyond); the rest is Python's frames
BASE_BYTES = 400 << 20  # the interpreter with numpy, polars, numba and DuckDB loaded
CHUNK_SHARE = 1 / 16  # of the budget: one chunk of the simulator's stream
CHUNK_BYTES_PER_REF = 96  # a chunk's reference read, decoded and fed to the kernel (measured: sim/chunked.py)
OPTION = "--memory-limit-gib"
WATCH_INTERVAL_S = 0.1
EXIT_CODE = 5  # the process stopped at its memory budget

_spill_dirs: set[Path] = set()


class MemoryLimitError(KvtraceError):
    """A step needed more memory than the budget allows (the message names the step and the option)."""

    exit_code = EXIT_CODE


def machine_memory_bytes() -> int:
    """Total memory of this machine (MemTotal; the cgroup's limit when it is lower)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        cg = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if cg.isdigit():
            total = min(total, int(cg))
    except OSError:
        pass
    return total


def default_limit_gib() -> float:
    """The default budget: DEFAULT_SHARE of the machine's memory, at most DEFAULT_MAX_GIB, at least MIN_GIB."""
    return round(max(MIN_GIB, min(DEFAULT_MAX_GIB, DEFAULT_SHARE * machine_memory_bytes() / GIB)), 2)


@dataclass(frozen=True)
class MemoryBudget:
    """LIMIT_GIB of resident memory for the whole process, and what each step may take of it."""

    limit_gib: float

    def __post_init__(self) -> None:
        if not MIN_GIB <= self.limit_gib < 1 << 20:  # refuses NaN
            raise UsageError(f"{OPTION} {self.limit_gib} must be in [{MIN_GIB}, 2^20)")

    @property
    def limit_bytes(self) -> int:
        """The budget in bytes."""
        return int(self.limit_gib * GIB)

    @property
    def duckdb_gib(self) -> float:
        """DuckDB's memory_limit (it spills to the run folder beyond it): DUCKDB_SHARE of the budget beyond
        the interpreter's BASE_BYTES (at least 0.25 GiB)."""
        return max(0.25, round((self.limit_gib - BASE_BYTES / GIB) * DUCKDB_SHARE, 2))

    @property
    def duckdb_limit(self) -> str:
        """duckdb_gib as DuckDB's setting ("1536MB")."""
        return f"{int(self.duckdb_gib * 1024)}MB"

    @property
    def chunk_refs(self) -> int:
        """Block references per chunk of a streamed pass (CHUNK_SHARE of the budget)."""
        return max(1 << 16, int(self.limit_bytes * CHUNK_SHARE / CHUNK_BYTES_PER_REF))

    def parallel_tasks(self, shared_bytes: int, task_bytes: int, wanted: int) -> int:
        """How many of WANTED tasks may run at once: SHARED_BYTES held once (the stream), TASK_BYTES each
        (a policy's state); at least 1 (one that does not fit is stopped by the watch, naming its step)."""
        room = self.limit_bytes - BASE_BYTES - shared_bytes
        return max(1, min(wanted, room // max(task_bytes, 1)))


def resolve_budget(limit_gib: float | None) -> MemoryBudget:
    """The budget of `--memory-limit-gib LIMIT_GIB` (None: default_limit_gib)."""
    return MemoryBudget(default_limit_gib() if limit_gib is None else float(limit_gib))


def current_step() -> str:
    """The name of the step running now (set by `step`), or "kvtrace"."""
    return _main_step[0]


_main_step = ["kvtrace"]  # the step running now, read by the watch's thread


def name_step(name: str) -> None:
    """Say that the step NAME runs now (until the next one is named)."""
    _main_step[0] = name


@contextmanager
def step(name: str) -> Iterator[None]:
    """Name the step that runs inside (what a memory stop names); an error leaves it named, for the
    command layer's one line (run_cli)."""
    before = _main_step[0]
    _main_step[0] = name
    yield
    _main_step[0] = before


@contextmanager
def spill_dir(path: Path) -> Iterator[Path]:
    """PATH (created) as a spill folder: removed after, and by a memory stop."""
    path.mkdir(parents=True, exist_ok=True)
    _spill_dirs.add(path)
    try:
        yield path
    finally:
        _spill_dirs.discard(path)
        shutil.rmtree(path, ignore_errors=True)


def held_now_bytes() -> int:
    """What this process holds now (its resident memory), at least BASE_BYTES: where a plan made mid-command
    (the fit's simulations, after its reading and fitting) starts from."""
    return max(BASE_BYTES, rss_bytes())


def rss_bytes() -> int:
    """Resident memory of this process now (/proc/self/statm; 0 where there is none)."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
        return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def limit_message(budget: MemoryBudget, step_name: str, used_bytes: int | None = None) -> str:
    """The one line of a memory stop."""
    used = f" (resident {used_bytes / GIB:.2f} GiB)" if used_bytes else ""
    jobs = " or run fewer simulations at once with --jobs 1" if step_name.startswith(("simulate", "fit")) else ""
    return (f"{step_name}: needs more memory than {OPTION} {budget.limit_gib:g}{used}; raise "
            f"{OPTION} (this machine has {machine_memory_bytes() / GIB:.1f} GiB){jobs}")


class MemoryWatch:
    """A thread that reads the process's resident memory (used_bytes) every WATCH_INTERVAL_S, keeps its peak, and stops
    the process with one line (limit_message, on stderr; spill folders removed; exit EXIT_CODE) when it
    goes over the budget: a compiled loop or a DuckDB query cannot be interrupted otherwise."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.peak_bytes = 0
        self.start_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvtrace-memory-watch", daemon=True)

    def used_bytes(self) -> int:
        """What the budget counts now: the process's resident memory, less what it held at the start beyond
        BASE_BYTES (a command run inside a larger process, a test's, counts its own memory only)."""
        return rss_bytes() - self.start_bytes + min(self.start_bytes, BASE_BYTES)

    def __enter__(self) -> MemoryWatch:
        self.start_bytes = rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        limit = self.budget.limit_bytes
        while not self._stop.wait(WATCH_INTERVAL_S):
            rss = self.used_bytes()
            self.peak_bytes = max(self.peak_bytes, rss)
            if rss > limit:
                sys.stderr.write(f"error: {limit_message(self.budget, current_step(), rss)}\n")
                sys.stderr.flush()
                for d in list(_spill_dirs):
                    shutil.rmtree(d, ignore_errors=True)
                os._exit(EXIT_CODE)


def out_of_memory(exc: BaseException, budget: MemoryBudget | None) -> MemoryLimitError | None:
    """EXC as a MemoryLimitError naming the current step when it is an out-of-memory error (Python's
    MemoryError, DuckDB's OutOfMemoryException, numpy's _ArrayMemoryError), else None."""
    if not isinstance(exc, MemoryError) and type(exc).__name__ != "OutOfMemoryException":
        return None
    if budget is None:  # a command without the option
        return MemoryLimitError(f"{current_step()}: out of memory (this machine has "
                                f"{machine_memory_bytes() / GIB:.1f} GiB); free some, or give a smaller input")
    return MemoryLimitError(limit_message(budget, current_step()))
