"""`analyze --executor ray`: the per-chain work in partitions (analysis/partitioned.py) gives the local run's
artifacts, file for file and row for row, to the bit, on the tiny fixture (partitions in this process) and on
the default trace (`make demo`'s synthetic to-C trace) on the suite's local Ray cluster; `fit --executor ray`
links the block accesses in partitions (fit/events.py) and writes the local policy and artifacts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.analysis.lifespan import quantile_cont
from tongyi_trace.analysis.partitioned import PARTITIONED_ANALYSES
from tongyi_trace.analysis.runner import ANALYSES, AnalysisReport, run_analyses
from tongyi_trace.errors import UsageError
from tongyi_trace.executor import ExecutorOptions, PartitionOptions
from tongyi_trace.run import RunDir, open_run
from tongyi_trace.trace.ingest import ingest_trace
from tongyi_trace.trace.partition import read_partition
from tongyi_trace.trace.synth import synth_to_file

MEASURED = {"elapsed_s", "run"}
INLINE = ExecutorOptions("local", None, 1)


def _copy_run(src: Path, dst: Path) -> RunDir:
    dst.mkdir(parents=True)
    for name in ("provenance.json", "requests.parquet", "blocks.parquet"):
        shutil.copy(src / name, dst / name)
    return RunDir(dst)


def _same_json(a: Any, b: Any, where: str) -> None:
    """A equals B exactly (floats to the bit), but for the measured timings."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            if k not in MEASURED:
                _same_json(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same_json(x, y, f"{where}[{i}]")
    else:
        assert a == b and type(a) is type(b), (where, a, b)


def assert_same_artifacts(local: Path, split: Path) -> list[str]:
    """Every file of LOCAL/analysis equals SPLIT's; returns the names of the files compared."""
    files = sorted(p.name for p in (local / "analysis").iterdir() if p.name != "manifest.json")
    assert files == sorted(p.name for p in (split / "analysis").iterdir() if p.name != "manifest.json")
    assert {f"{n}.json" for n in ANALYSES} <= set(files)
    for name in files:
        a, b = local / "analysis" / name, split / "analysis" / name
        if name.endswith(".json"):
            _same_json(json.loads(a.read_text()), json.loads(b.read_text()), name)
            continue
        x, y = pl.read_parquet(a), pl.read_parquet(b)
        assert x.schema == y.schema and x.height == y.height, name
        for col in x.columns:
            assert x[col].equals(y[col]), (name, col)  # floats to the bit, nulls in the same rows
    return files


def _both(src: Path, tmp: Path, opts: PartitionOptions) -> tuple[AnalysisReport, AnalysisReport]:
    local = run_analyses(_copy_run(src, tmp / "local"))
    split = run_analyses(_copy_run(src, tmp / "split"), partitions=opts)
    return local, split


@pytest.fixture(scope="module")
def tiny_src(tiny_bailian_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("tiny") / "run"
    ingest_trace(tiny_bailian_path, run)
    return run


@pytest.mark.parametrize("num_partitions", [1, 3, 7])
def test_partitions_in_process_equal_local(tiny_src: Path, tmp_path: Path, num_partitions: int) -> None:
    local, split = _both(tiny_src, tmp_path, PartitionOptions(INLINE, num_partitions))
    assert local.num_partitions == 0 and split.num_partitions == num_partitions
    assert len(assert_same_artifacts(tmp_path / "local", tmp_path / "split")) == 34
    # golden figures of the fixture (tests/analysis/test_golden_tiny.py), through the merge
    assert split.results["live_set"].headline["peak_live_blocks"] == 5
    assert split.results["hit_ratio"].headline["num_hit_blocks"] == local.results["hit_ratio"].headline[
        "num_hit_blocks"] > 0


def test_partitions_cover_every_reference_once(tiny_src: Path) -> None:
    tables = open_run(tiny_src).tables()
    num = 5
    parts = [read_partition(tables, p, num) for p in range(num)]
    for side, key in ((0, "chain_id"), (1, "block_id")):
        ids = [set(t[side].column(key).to_pylist()) for t in parts]
        assert sum(t[side].num_rows for t in parts) == tables.provenance["num_block_refs"]
        assert all(not (ids[i] & ids[j]) for i in range(num) for j in range(i + 1, num))  # an id in one partition
    assert sum(1 for t in parts if t[0].num_rows) >= 2  # the split is real


def test_only_the_per_chain_analyses_are_split(tiny_src: Path, tmp_path: Path) -> None:
    rep = run_analyses(_copy_run(tiny_src, tmp_path / "r"), only="request_mix,kv_size",
                       partitions=PartitionOptions(INLINE, 3))
    assert rep.num_partitions == 0  # nothing per chain asked: no partition task ran
    assert set(PARTITIONED_ANALYSES) < set(ANALYSES)
    with pytest.raises(UsageError, match="--partitions 0"):
        run_analyses(_copy_run(tiny_src, tmp_path / "z"), partitions=PartitionOptions(INLINE, 0))


@given(st.lists(st.tuples(st.floats(0, 1e6, allow_nan=False), st.integers(1, 5)), min_size=1, max_size=40),
       st.lists(st.floats(0, 1), min_size=1, max_size=4))
@settings(max_examples=examples(100), deadline=None)
def test_quantile_cont_is_duckdbs(hist: list[tuple[float, int]], qs: list[float]) -> None:
    merged: dict[float, int] = {}
    for v, c in hist:
        merged[v] = merged.get(v, 0) + c
    values = np.array(sorted(merged))
    counts = np.array([merged[v] for v in values])
    xs = np.repeat(values, counts)
    con = duckdb.connect()
    con.register("t", pl.DataFrame({"x": xs}).to_arrow())
    want = con.sql("SELECT quantile_cont(x, $qs) FROM t", params={"qs": qs}).fetchall()[0][0]
    assert [quantile_cont(values, counts, q) for q in qs] == want


@pytest.mark.full  # 35-45 s of the fast lane's six minutes; the fast lane splits the small fixture on Ray
def test_default_trace_on_ray_equals_local(ray_address: str, tmp_path: Path) -> None:
    trace = tmp_path / "to-c.jsonl"
    synth_to_file("to-c", 1, trace)  # `make demo`'s trace: kvtrace synth --profile to-c --seed 1
    src = tmp_path / "run"
    ingest_trace(trace, src)
    _local, split = _both(src, tmp_path, PartitionOptions(ExecutorOptions("ray", ray_address), 8))
    assert split.num_partitions == 8
    assert len(assert_same_artifacts(tmp_path / "local", tmp_path / "split")) == 34
    assert split.results["hit_ratio"].headline["num_block_refs"] > 6_000_000


def test_cli_partitions_on_the_local_pool(tiny_src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from tongyi_trace.cli import app

    run_analyses(_copy_run(tiny_src, tmp_path / "local"))
    _copy_run(tiny_src, tmp_path / "split")
    monkeypatch.chdir(tmp_path)  # a relative run path: the tasks get absolute ones
    out = CliRunner().invoke(app, ["analyze", "split", "--partitions", "3", "--json", "-q"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["analyses"]["live_set"]["headline"]["peak_live_blocks"] == 5
    assert_same_artifacts(tmp_path / "local", tmp_path / "split")
    for args, why in ((["--partitions", "0"], "--partitions 0: give a number in 1..4096"),
                      (["--ray-address", "127.0.0.1:1"], "--ray-address needs --executor ray")):
        bad = CliRunner().invoke(app, ["analyze", "split", *args, "-q"])
        assert bad.exit_code == 2 and why in bad.output and "Traceback" not in bad.output


def _fit_artifacts(src: Path, folder: Path, **kw: Any) -> dict[str, Any]:
    from tongyi_trace.fit.policy_fit import fit_policy

    run = _copy_run(src, folder)
    fit_policy(run.path, folder / "policy.json", train="0:200", test="200:", capacities=None, min_samples=10,
               **kw)
    return {"policy": json.loads((folder / "policy.json").read_text()),
            "train_test": json.loads((run.path / "fit" / "train_test.json").read_text()),
            "cdf": pl.read_parquet(run.path / "fit" / "cdf.parquet")}


@pytest.mark.parametrize("kind", ["in-process", "ray"])
def test_fit_partitioned_equals_local(tiny_run: Path, tmp_path: Path, kind: str,
                                      request: pytest.FixtureRequest) -> None:
    """`fit --executor ray` links the block accesses in partitions: the policy file and the fit artifacts are
    the local ones to the bit."""
    local = _fit_artifacts(tiny_run, tmp_path / "local")
    kw: dict[str, Any] = ({"executor": "ray", "ray_address": request.getfixturevalue("ray_address"),
                           "partitions": 5} if kind == "ray" else {"jobs": 1, "partitions": 5})
    split = _fit_artifacts(tiny_run, tmp_path / "split", **kw)
    _same_json(local["policy"], split["policy"], "policy.json")
    _same_json(local["train_test"], split["train_test"], "train_test.json")
    assert local["cdf"].equals(split["cdf"]) and local["cdf"].height > 0
    assert len(local["policy"]["categories"]) >= 2


def test_a_failed_partition_stops_with_one_line_and_writes_nothing(tiny_src: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import tongyi_trace.analysis.partitioned as partitioned
    from tongyi_trace.errors import KvtraceError

    real = partitioned.read_partition

    def broken(tables: Any, part: int, num: int) -> Any:
        if part == 2:
            raise OSError("blocks.parquet: Input/output error")
        return real(tables, part, num)

    monkeypatch.setattr(partitioned, "read_partition", broken)  # the inline executor runs tasks in this process
    seen: list[tuple[int, int]] = []
    run = _copy_run(tiny_src, tmp_path / "r")
    with pytest.raises(KvtraceError) as err:
        run_analyses(run, partitions=PartitionOptions(INLINE, 4), on_partition=lambda d, n: seen.append((d, n)))
    assert str(err.value) == ("analyze --executor local: 1 of 4 partitions failed (partition 2: OSError: "
                              "blocks.parquet: Input/output error); nothing was written, run again")
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]  # progress as each partition ended
    assert not (run.path / "analysis").exists()
