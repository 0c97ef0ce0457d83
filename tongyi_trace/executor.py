"""Where fan-out work runs: the local process pool (default) or a Ray cluster (`pip install kvtrace[ray]`).

Every command that fans out (`simulate` sweeps, `study`, capacity-aware fitting) calls `map_tasks`:
FN(task, shared) runs once per task; SHARED (numpy arrays and small objects) is shipped once per call,
not once per task: memory-mapped .npy files for the local pool, one `ray.put` (zero-copy numpy) for Ray.
ON_RESULT receives each task's outcome in the calling process as soon as it finishes, so callers write
results incrementally. A task that raises (or whose worker dies) is retried once, then reported as a
failed outcome with its error; the other tasks go on. Ray is imported only by the Ray executor.
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tongyi_trace.compile_notice import log_compiles, worker_compiled
from tongyi_trace.errors import ClusterError, KvtraceError, UsageError

EXECUTORS = ("local", "ray")
MAX_ATTEMPTS = 2  # a failed task is retried once, unless it failed on its input (a KvtraceError cannot change)
CONNECT_TIMEOUT_S = 10.0
NOTICE_POLL_S = 1.0  # how often the local pool's caller looks whether a worker began compiling a kernel
INLINE_BELOW_REFS = 1_000_000  # by default, work over fewer block references than this runs in this process
DEFAULT_PARTITIONS = 16  # partitions of the per-block work of analyze and fit with --executor ray
MAX_PARTITIONS = 4096

TaskFn = Callable[[Any, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class ExecutorOptions:
    """Which executor runs the tasks (`--executor`, `--ray-address`, `--jobs`)."""

    kind: str = "local"  # local | ray
    address: str | None = None  # Ray only; default $RAY_ADDRESS, else a Ray instance started here
    jobs: int = 0  # local: worker processes (0 = one per core); ray: CPUs of a Ray instance started here


@dataclass(frozen=True)
class PartitionOptions:
    """How per-block work is split (`--partitions`): NUM_PARTITIONS tasks on the executor EXECUTOR names
    (trace/partition.py: by a hash of the chained block id)."""

    executor: ExecutorOptions
    num_partitions: int = DEFAULT_PARTITIONS


def check_partitions(num_partitions: int) -> int:
    """NUM_PARTITIONS, or a UsageError when it is not in 1..MAX_PARTITIONS."""
    if not 1 <= num_partitions <= MAX_PARTITIONS:
        raise UsageError(f"--partitions {num_partitions}: give a number in 1..{MAX_PARTITIONS}")
    return num_partitions


@dataclass(frozen=True)
class TaskOutcome:
    """One task's result, or the one-line error it failed with after its retry."""

    index: int  # position in the task list
    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the task returned a value."""
        return self.error is None


@dataclass(frozen=True)
class MapSummary:
    """How a `map_tasks` call went."""

    executor: str
    num_tasks: int
    num_failed: int
    elapsed_s: float


OnResult = Callable[[TaskOutcome], None]


class Executor(Protocol):
    """Runs FN over TASKS with SHARED, calling ON_RESULT as each task finishes (any order)."""

    name: str

    def run(self, fn: TaskFn, tasks: Sequence[Any], shared: Mapping[str, Any], on_result: OnResult) -> None:
        """Run every task once (plus one retry on failure); raise KvtraceError if the executor itself fails."""
        ...


def check_options(opts: ExecutorOptions) -> ExecutorOptions:
    """OPTS with the executor name checked and Ray's address resolved from $RAY_ADDRESS."""
    kind = opts.kind.strip().lower()
    if kind not in EXECUTORS:
        raise UsageError(f"--executor {opts.kind!r}: use one of {', '.join(EXECUTORS)}")
    if kind == "local" and opts.address:
        raise UsageError("--ray-address needs --executor ray")
    if opts.jobs < 0:
        raise UsageError(f"--jobs {opts.jobs}: use 0 (one per core) or a positive number")
    address = (opts.address or os.environ.get("RAY_ADDRESS") or None) if kind == "ray" else None
    return ExecutorOptions(kind, address, opts.jobs)


def sized_for(opts: ExecutorOptions, num_refs: int) -> ExecutorOptions:
    """OPTS, or one job in this process when OPTS is the default local pool and the work covers fewer than
    INLINE_BELOW_REFS block references (starting worker processes would cost more than the work)."""
    if opts.kind == "local" and opts.jobs == 0 and num_refs < INLINE_BELOW_REFS:
        return ExecutorOptions("local", None, 1)
    return opts


def make_executor(opts: ExecutorOptions) -> Executor:
    """The executor OPTS names."""
    opts = check_options(opts)
    if opts.kind == "ray":
        return RayExecutor(opts.address, opts.jobs)
    return LocalExecutor(opts.jobs)


def map_tasks(fn: TaskFn, tasks: Sequence[Any], shared: Mapping[str, Any], on_result: OnResult,
              opts: ExecutorOptions | None = None) -> MapSummary:
    """Run FN(task, SHARED) for every task on the executor OPTS names; ON_RESULT(outcome) as each ends.

    FN must be a module-level function (it is sent to other processes by reference)."""
    ex = make_executor(opts or ExecutorOptions())
    failed = 0

    def seen(out: TaskOutcome) -> None:
        nonlocal failed
        failed += not out.ok
        on_result(out)

    t0 = time.perf_counter()
    if tasks:
        ex.run(fn, tasks, shared, seen)
    return MapSummary(ex.name, len(tasks), failed, time.perf_counter() - t0)


def error_line(e: BaseException) -> str:
    """`Type: message`, first line only (a failed row's error)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


# ---- local: a process pool over memory-mapped shared arrays ----------------------------------------------

_SHARED: dict[str, Any] = {}


class LocalExecutor:
    """Worker processes on this machine (spawned); one task in flight per worker."""

    name = "local"

    def __init__(self, jobs: int = 0) -> None:
        self.jobs = jobs or os.cpu_count() or 1

    def run(self, fn: TaskFn, tasks: Sequence[Any], shared: Mapping[str, Any], on_result: OnResult) -> None:
        """See Executor.run; one job (or one task) runs in this process."""
        if self.jobs <= 1 or len(tasks) <= 1:
            for i, t in enumerate(tasks):
                on_result(_attempt_inline(fn, i, t, shared))
            return
        with tempfile.TemporaryDirectory(prefix="kvtrace-shared-") as tmp:
            _save_shared(Path(tmp), shared)
            attempts = [0] * len(tasks)
            todo = list(range(len(tasks)))
            while todo:  # a second round only when a worker died and broke the pool
                todo = self._round(fn, tasks, tmp, todo, attempts, on_result)

    def _round(self, fn: TaskFn, tasks: Sequence[Any], tmp: str, todo: list[int], attempts: list[int],
               on_result: OnResult) -> list[int]:
        ctx = get_context("spawn")
        left: list[int] = []
        with ProcessPoolExecutor(max_workers=min(self.jobs, len(todo)), mp_context=ctx,
                                 initializer=_load_shared, initargs=(tmp,)) as pool:
            futs: dict[Future[Any], int] = {pool.submit(_call_shared, fn, tasks[i]): i for i in todo}
            while futs:
                done, _ = wait(futs, timeout=NOTICE_POLL_S, return_when=FIRST_COMPLETED)
                worker_compiled(tmp)
                for fut in done:
                    i = futs.pop(fut)
                    attempts[i] += 1
                    try:
                        on_result(TaskOutcome(i, value=fut.result()))
                        continue
                    except BrokenProcessPool as e:
                        err: BaseException = e
                    except Exception as e:
                        err = e
                    if attempts[i] >= MAX_ATTEMPTS or isinstance(err, KvtraceError):
                        on_result(TaskOutcome(i, error=error_line(err)))
                    elif isinstance(err, BrokenProcessPool):
                        left.append(i)
                    else:
                        futs[pool.submit(_call_shared, fn, tasks[i])] = i
        return sorted(left)


def _attempt_inline(fn: TaskFn, index: int, task: Any, shared: Mapping[str, Any]) -> TaskOutcome:
    err: Exception | None = None
    for _ in range(MAX_ATTEMPTS):
        try:
            return TaskOutcome(index, value=fn(task, shared))
        except KvtraceError as e:  # bad input fails the same way again: no retry
            return TaskOutcome(index, error=error_line(e))
        except Exception as e:
            err = e
    assert err is not None
    return TaskOutcome(index, error=error_line(err))


def _save_shared(folder: Path, shared: Mapping[str, Any]) -> None:
    rest = {}
    for key, value in shared.items():
        if isinstance(value, np.ndarray) and value.dtype != object:
            np.save(folder / f"{key}.npy", value)
        else:
            rest[key] = value
    (folder / "objects.pkl").write_bytes(pickle.dumps(rest, protocol=pickle.HIGHEST_PROTOCOL))


def _load_shared(folder: str) -> None:
    log_compiles(folder)  # the caller says the compile notice; bench/bench_compile.py counts these compiles
    path = Path(folder)
    shared: dict[str, Any] = pickle.loads((path / "objects.pkl").read_bytes())
    for f in path.glob("*.npy"):
        # pages shared by every worker of the machine; copy-on-write, so the arrays are writable as in the
        # calling process and a kernel over them compiles once, not once more for read-only arrays
        shared[f.stem] = np.load(f, mmap_mode="c")
    _SHARED.clear()
    _SHARED.update(shared)


def _call_shared(fn: TaskFn, task: Any) -> Any:
    return fn(task, _SHARED)


# ---- ray: tasks on a Ray cluster, shared arrays in the object store ----------------------------------------


class RayExecutor:
    """One Ray task per item (1 CPU each), retried once by Ray, results collected with ray.wait.

    The Ray driver runs in a child process that streams outcomes back: Ray ends a driver process outright
    when it loses its cluster, and this way the command itself survives to say so in one line."""

    name = "ray"

    def __init__(self, address: str | None = None, jobs: int = 0) -> None:
        self.address = address
        self.jobs = jobs

    def run(self, fn: TaskFn, tasks: Sequence[Any], shared: Mapping[str, Any], on_result: OnResult) -> None:
        """See Executor.run; connects (or starts a local Ray instance) and disconnects at the end."""
        _import_ray()
        if self.address:
            _check_reachable(self.address)
        ctx = get_context("spawn")
        with tempfile.TemporaryDirectory(prefix="kvtrace-shared-") as tmp:
            _save_shared(Path(tmp), shared)
            q = ctx.Queue()
            fn_blob = _import_ray().cloudpickle.dumps(fn)  # here, so a script's own functions go by value
            child = ctx.Process(target=_ray_driver, args=(self, fn_blob, list(tasks), tmp, q), daemon=True)
            child.start()
            finished = 0
            try:
                while True:
                    try:
                        msg = q.get(timeout=1.0)
                    except queue.Empty:
                        if child.is_alive():
                            continue
                        raise ClusterError(f"{self._where()}: lost the connection after {finished} of {len(tasks)} "
                                           "tasks (the Ray driver ended; Ray's logs are in its session folder); "
                                           "the finished results are written, run again when the cluster is back"
                                           ) from None
                    if msg[0] == "outcome":
                        finished += 1
                        on_result(msg[1])
                    elif msg[0] == "error":
                        kinds = {"UsageError": UsageError, "ClusterError": ClusterError}
                        raise kinds.get(msg[1], KvtraceError)(msg[2])
                    else:
                        break
            finally:
                if child.is_alive():
                    child.terminate()
                child.join()

    def drive(self, fn_blob: bytes, tasks: Sequence[Any], shared: Mapping[str, Any], on_result: OnResult) -> None:
        """Connect, run the tasks, disconnect: in the Ray driver process."""
        ray = _import_ray()
        self._connect(ray)
        try:
            self._run(ray, fn_blob, tasks, shared, on_result)
        finally:
            ray.shutdown()

    def _where(self) -> str:
        return f"Ray cluster at {self.address}" if self.address else "the local Ray instance"

    def _connect(self, ray: Any) -> None:
        kw: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": False, "configure_logging": True}
        if self.address:
            kw["address"] = self.address
        else:
            kw.update(address="local", include_dashboard=False, num_cpus=self.jobs or None)
        try:
            ray.init(**kw)
        except Exception as e:  # ConnectionError, RuntimeError, ValueError depending on what is wrong
            raise UsageError(f"--ray-address {self.address}: cannot connect to a Ray cluster ({error_line(e)}); "
                             "start one with 'ray start --head', or omit --ray-address (and RAY_ADDRESS) "
                             "to start a local instance") from None

    def _run(self, ray: Any, fn_blob: bytes, tasks: Sequence[Any], shared: Mapping[str, Any],
             on_result: OnResult) -> None:
        exc = ray.exceptions
        per_task = (exc.RayTaskError, exc.WorkerCrashedError, exc.TaskCancelledError, exc.ObjectLostError,
                    exc.NodeDiedError, getattr(exc, "OutOfMemoryError", exc.WorkerCrashedError))
        remote = ray.remote(num_cpus=1, max_retries=MAX_ATTEMPTS - 1, retry_exceptions=True)(_call_with)
        finished = 0
        try:
            ref = ray.put(dict(shared))  # once: every task on a node maps the same buffers
            pending = {remote.remote(fn_blob, t, ref): i for i, t in enumerate(tasks)}
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                if len(pending) > 1:  # collect everything else that is already done, cheaply
                    more, _ = ray.wait([r for r in pending if r not in ready], num_returns=len(pending) - 1,
                                       timeout=0)
                    ready += more
                for r in ready:
                    i = pending.pop(r)
                    try:
                        out = TaskOutcome(i, value=ray.get(r))
                    except per_task as e:
                        cause = getattr(e, "cause", None)
                        out = TaskOutcome(i, error=error_line(cause if isinstance(cause, BaseException) else e))
                    finished += 1
                    on_result(out)
        except (exc.RayError, ConnectionError) as e:
            raise ClusterError(f"{self._where()}: lost the connection after {finished} of {len(tasks)} tasks "
                               f"({error_line(e)}); the finished results are written, run again when the "
                               "cluster is back") from None


def _ray_driver(ex: RayExecutor, fn_blob: bytes, tasks: list[Any], folder: str, q: Any) -> None:
    """The child process of RayExecutor.run: outcomes go back through Q, then ('done',) or ('error', ...)."""
    devnull = os.open(os.devnull, os.O_WRONLY)  # Ray's own console logging; its log files stay in its session
    os.dup2(devnull, 2)
    _load_shared(folder)
    try:
        ex.drive(fn_blob, tasks, dict(_SHARED), lambda out: q.put(("outcome", out)))
        q.put(("done",))
    except KvtraceError as e:
        q.put(("error", type(e).__name__, str(e)))
    except Exception as e:
        q.put(("error", "KvtraceError", f"{ex._where()}: {error_line(e)}"))
    q.close()
    q.join_thread()


def _check_reachable(address: str) -> None:
    """Fail fast on a HOST:PORT nobody listens on (ray.init would retry for minutes)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        if address == "auto":
            return
        raise UsageError(f"--ray-address {address!r}: write HOST:PORT (e.g. 10.0.0.5:6379), ray://HOST:PORT or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise UsageError(f"--ray-address {address}: cannot connect to a Ray cluster ({error_line(e)}); start one "
                         "with 'ray start --head', or omit --ray-address (and RAY_ADDRESS) to start a local "
                         "instance") from None


def _call_with(fn_blob: bytes, task: Any, shared: Mapping[str, Any]) -> Any:
    from ray import cloudpickle

    fn: TaskFn = cloudpickle.loads(fn_blob)
    return fn(task, shared)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs Ray: pip install 'kvtrace[ray]' (or pip install 'ray>=2.9')") from None
    return ray
