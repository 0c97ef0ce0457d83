"""docs/api.md's examples run (in order, one namespace) on a small synthetic trace, and docs/example_notebook.py
runs end to end; the API's frames match what the CLI's core wrote."""

from __future__ import annotations

import re
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder holding trace.jsonl (to-c profile, 300 requests over 600 s), as the current directory."""
    from tongyi_trace.trace.synth import synth_to_file

    d = tmp_path_factory.mktemp("api")
    synth_to_file("to-c", 1, d / "trace.jsonl", num_requests=300, duration_s=600)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(d)
        yield d


def test_docs_api_examples_run(workdir: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "api.md").read_text(), flags=re.S)
    assert len(blocks) == 4
    ns: dict[str, object] = {}
    for code in blocks:
        exec(compile(code, "docs/api.md", "exec"), ns)
    df = ns["df"]
    assert isinstance(df, pl.DataFrame)
    assert set(df["policy"]) == {"lru", "s3fifo", "wa"} and set(df["capacity"]) == {"5%", "1GiB"}
    saved = pl.read_parquet(workdir / "runs" / "t" / "sim" / "results.parquet")
    assert sorted(saved["hit_ratio"].to_list()) == sorted(df["hit_ratio"].to_list())
    curve = ns["curve"]
    assert isinstance(curve, pl.DataFrame) and curve["hit_ratio"].is_sorted()
    # LRU in the sweep sits exactly on the one-pass curve
    for r in df.filter(pl.col("policy") == "lru").iter_rows(named=True):
        on_curve = curve.filter(pl.col("capacity_blocks") <= r["capacity_blocks"])["hit_ratio"].max()
        assert r["hit_ratio"] == pytest.approx(on_curve)
    assert ns["rec"]["schema"] == "kvtrace.recommendation/1"  # type: ignore[index]


def test_example_notebook_runs(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["example_notebook.py", str(workdir / "trace.jsonl")])
    ns = runpy.run_path(str(REPO / "docs" / "example_notebook.py"))
    assert (workdir / "runs" / "trace" / "report.html").is_file()
    assert ns["df"].height == 9  # 3 policies x 3 capacities
