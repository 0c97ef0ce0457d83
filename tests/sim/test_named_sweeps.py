"""Named sweeps coexist in RUN/sim/NAME/; the latest is also RUN/sim/; the report reads the pinned one (the
last --name)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import polars as pl
from typer.testing import CliRunner

from tongyi_trace.cli import app
from tongyi_trace.report.render import build_sections
from tongyi_trace.run import open_run
from tongyi_trace.sim.sweep import list_sweeps

REQS = [[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3, 7], [5, 6, 8]]


def _sim(run: Path, *args: str) -> None:
    res = CliRunner().invoke(app, ["simulate", str(run), "-p", "lru", "-j", "1", *args])
    assert res.exit_code == 0, res.output


def test_named_sweeps_coexist(make_run: Callable[..., Path]) -> None:
    run = make_run(REQS)
    _sim(run, "-c", "2", "--name", "small")
    _sim(run, "-c", "4,6", "--name", "big")
    assert list_sweeps(run) == ["big", "small"]
    small = pl.read_parquet(run / "sim" / "small" / "results.parquet")
    big = pl.read_parquet(run / "sim" / "big" / "results.parquet")
    assert small["capacity_blocks"].to_list() == [2] and big["capacity_blocks"].to_list() == [4, 6]
    latest = pl.read_parquet(run / "sim" / "results.parquet")
    assert latest.equals(big)  # RUN/sim/ holds the latest sweep
    sim = next(s for s in build_sections(open_run(run)) if s.key == "sim")
    assert [r[1] for r in sim.tables["hit"].rows] == ["4", "6"]
    _sim(run, "-c", "3")  # an unnamed sweep replaces RUN/sim/ only
    assert pl.read_parquet(run / "sim" / "results.parquet")["capacity_blocks"].to_list() == [3]
    sim = next(s for s in build_sections(open_run(run)) if s.key == "sim")
    assert [r[1] for r in sim.tables["hit"].rows] == ["4", "6"]  # the report still reads the pinned 'big'
    assert list_sweeps(run) == ["big", "small"]
    assert json.loads((run / "sim" / "small" / "summary.json").read_text())["capacities"][0]["num_blocks"] == 2
    res = CliRunner().invoke(app, ["simulate", str(run), "-c", "2", "--name", "fleet"])
    assert res.exit_code == 2 and "--name 'fleet'" in res.output
    res = CliRunner().invoke(app, ["simulate", str(run), "-c", "2", "--name", "../x"])
    assert res.exit_code == 2 and "--name '../x'" in res.output
