"""The executor layer: local and Ray give the same sweep row for row; a failing task becomes a failed row."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tongyi_trace.errors import UsageError
from tongyi_trace.executor import INLINE_BELOW_REFS, ExecutorOptions, TaskOutcome, check_options, map_tasks, sized_for
from tongyi_trace.run import open_run
from tongyi_trace.sim.capacity import Capacity
from tongyi_trace.sim.stream import load_stream, next_request_of_refs
from tongyi_trace.sim.sweep import SweepConfig, _shared, _worker_task, run_sweep

TIMING = {"elapsed_s", "evict_decision_ns", "refs_per_s"}  # measured, differ from run to run
POLICIES = ["lru", "fifo", "s3fifo", "oracle"]


def _stable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _sweep(run: Path, executor: str, address: str | None, jobs: int) -> tuple[list[dict[str, Any]], list[str]]:
    res = run_sweep(open_run(run), SweepConfig(policies=POLICIES, capacities="1%,10%,1L", jobs=jobs,
                                               executor=executor, ray_address=address))
    lines = (run / "sim" / "results.jsonl").read_text().splitlines()
    assert res.summary["num_failed"] == 0
    return _stable(res.rows), lines


def test_ray_matches_local_row_for_row(tiny_run: Path, ray_address: str) -> None:
    inline, _ = _sweep(tiny_run, "local", None, 1)
    pool, _ = _sweep(tiny_run, "local", None, 2)
    ray_rows, ray_lines = _sweep(tiny_run, "ray", ray_address, 0)
    assert len(inline) == len(POLICIES) * 3
    assert ray_rows == inline
    assert pool == inline
    assert len(ray_lines) == len(inline)  # written as they finished
    hits = {(r["policy"], r["capacity"]): r["hit_ratio"] for r in inline}
    assert hits[("oracle", "1L")] >= hits[("lru", "1L")] > hits[("lru", "1%")] > 0


def _bad_tasks(run: Path) -> tuple[list[Any], dict[str, Any]]:
    stream = load_stream(open_run(run).tables())
    nxt = next_request_of_refs(stream.req_off, stream.blk, stream.num_ids)
    cap = Capacity(label="64", num_blocks=64)
    tasks = [("lru", "lru", {}, cap), ("fifo", "fifo", {"no_such_parameter": 1}, cap), ("lfu", "lfu", {}, cap)]
    return tasks, _shared(stream, nxt, None, None, None)


@pytest.mark.parametrize("kind", ["local-inline", "local-pool", "ray"])
def test_failing_task_is_a_failed_row(tiny_run: Path, kind: str, request: pytest.FixtureRequest) -> None:
    tasks, shared = _bad_tasks(tiny_run)
    if kind == "ray":
        opts = ExecutorOptions("ray", request.getfixturevalue("ray_address"))
    else:
        opts = ExecutorOptions("local", jobs=1 if kind == "local-inline" else 2)
    seen: list[TaskOutcome] = []
    summary = map_tasks(_worker_task, tasks, shared, seen.append, opts)
    assert summary.num_tasks == 3 and summary.num_failed == 1
    by_index = {o.index: o for o in seen}
    assert sorted(by_index) == [0, 1, 2]
    assert not by_index[1].ok and "no_such_parameter" in (by_index[1].error or "")
    assert by_index[1].error is not None and "\n" not in by_index[1].error
    assert by_index[0].ok and by_index[0].value["policy"] == "lru" and by_index[0].value["capacity_blocks"] == 64
    assert by_index[2].ok and by_index[2].value["num_refs"] == by_index[0].value["num_refs"] > 0


def test_options_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="--executor 'dask'"):
        check_options(ExecutorOptions("dask"))
    with pytest.raises(UsageError, match="--ray-address needs --executor ray"):
        check_options(ExecutorOptions("local", "127.0.0.1:1"))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6390")
    assert check_options(ExecutorOptions("ray")).address == "127.0.0.1:6390"
    assert check_options(ExecutorOptions("ray", "127.0.0.1:7000")).address == "127.0.0.1:7000"
    assert check_options(ExecutorOptions("local")).address is None


def test_small_work_runs_in_this_process_unless_asked_otherwise() -> None:
    default = ExecutorOptions()
    assert sized_for(default, INLINE_BELOW_REFS - 1) == ExecutorOptions("local", None, 1)
    assert sized_for(default, INLINE_BELOW_REFS) == default
    # an explicit --jobs or Ray is kept whatever the size
    assert sized_for(ExecutorOptions("local", None, 2), 10) == ExecutorOptions("local", None, 2)
    assert sized_for(ExecutorOptions("ray", None, 0), 10) == ExecutorOptions("ray", None, 0)


def test_unreachable_cluster_is_one_line(tiny_run: Path) -> None:
    pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tasks, shared = _bad_tasks(tiny_run)
    with pytest.raises(UsageError, match=f"--ray-address 127.0.0.1:{port}: cannot connect") as e:
        map_tasks(_worker_task, tasks, shared, lambda o: None, ExecutorOptions("ray", f"127.0.0.1:{port}"))
    assert "\n" not in str(e.value)


def test_summary_names_executor_and_failures(tiny_run: Path) -> None:
    # summary.json says which executor ran the sweep and lists the failed configurations (none here)
    res = run_sweep(open_run(tiny_run), SweepConfig(policies=["lru"], capacities="1%,10%", jobs=1))
    summary = json.loads((tiny_run / "sim" / "summary.json").read_text())
    assert summary["num_failed"] == 0 and summary["failed"] == [] and summary["executor"] == "local"
    assert [r["capacity"] for r in res.rows] == ["1%", "10%"]


def _slow(task: int, shared: Any) -> int:
    import time

    time.sleep(1.0)
    return task


@pytest.mark.slow
@pytest.mark.full
def test_lost_cluster_stops_with_one_line(make_ray_head: Callable[..., Any]) -> None:
    # a cluster of its own, killed after the second result: the command says so in one line (Ray takes
    # about a minute to give up on its head node) and every result reported before is kept
    import os
    import signal
    import sys

    import ray

    from tongyi_trace.errors import KvtraceError

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    seen: list[TaskOutcome] = []
    with make_ray_head(num_cpus=1) as (address, pgid):

        def on_result(out: TaskOutcome) -> None:
            seen.append(out)
            if len(seen) == 2:
                os.killpg(pgid, signal.SIGKILL)

        with pytest.raises(KvtraceError, match=r"lost the connection after \d+ of 12 tasks") as e:
            map_tasks(_slow, list(range(12)), {}, on_result, ExecutorOptions("ray", address))
    assert "\n" not in str(e.value)
    assert [o.value for o in seen[:2]] == [0, 1] and all(o.ok for o in seen[:2])


@pytest.mark.full  # 20-37 s; the fast lane runs the capacity-aware fit locally and the partitioned fit on Ray
def test_capacity_aware_fit_on_ray_matches_local(tiny_run: Path, ray_address: str, tmp_path: Path) -> None:
    """`kvtrace fit --capacity` fans its simulations out through the same executor: the choices and every
    tuning row are the same on Ray as in this process and on the local pool."""

    import polars as pl

    from tongyi_trace.fit.policy_fit import fit_policy

    docs, tables = [], []
    for name, kw in (("inline", {"jobs": 1}), ("pool", {"jobs": 2}),
                     ("ray", {"executor": "ray", "ray_address": ray_address})):
        out = tmp_path / f"{name}.json"
        fit_policy(tiny_run, out, train="0:200", test="200:", capacities="20%,50%", min_samples=10,
                   **kw)  # type: ignore[arg-type]
        docs.append(json.loads(out.read_text())["choices"])
        tables.append(pl.read_parquet(tiny_run / "fit" / "tuning.parquet").sort(["capacity", "window", "candidate"]))
    assert docs[0] == docs[1] == docs[2] and len(docs[0]) == 2
    assert tables[0].equals(tables[1]) and tables[0].equals(tables[2]) and tables[0].height >= 20


def _fails(task: str, shared: Any) -> int:
    from tongyi_trace.errors import InputError

    with open(shared["log"], "a") as f:
        f.write(task + "\n")
    if task == "input":
        raise InputError("t.jsonl:4: field 'timestamp' must be a number of seconds, got 'x'")
    raise RuntimeError("a worker's accident")


@pytest.mark.parametrize("jobs", [1, 2])  # in this process, and in a process pool
def test_an_input_error_is_not_retried(tmp_path: Path, jobs: int) -> None:
    """Issue 42: study retried a bad trace's InputError, which cannot change; other failures keep their retry."""
    log = tmp_path / "attempts.log"
    outcomes: list[TaskOutcome] = []
    map_tasks(_fails, ["input", "other"], {"log": str(log)}, outcomes.append, ExecutorOptions("local", None, jobs))
    assert sorted(log.read_text().split()) == ["input", "other", "other"]
    errors = {o.index: o.error for o in outcomes}
    assert errors[0] == "InputError: t.jsonl:4: field 'timestamp' must be a number of seconds, got 'x'"
    assert errors[1] is not None and "a worker's accident" in errors[1]
