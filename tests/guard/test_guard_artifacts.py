"""The guard's artifacts (RUN/sim/guard_*.parquet) and its report section, from a guarded run of the small
shifted stream."""

from __future__ import annotations

import polars as pl

from tongyi_trace.report.sections import guard as guard_section
from tongyi_trace.run import RunDir
from tongyi_trace.sim.guarded import guard_cell, pop_guard_tables, simulate_guarded, write_guard_tables

from .conftest import CAPACITY, shifted
from .test_guard import BASE


def test_tables_written_and_reported(tmp_path, first_hour_fit) -> None:
    run = simulate_guarded(shifted(), "wa", CAPACITY, fit=first_hour_fit,
                           params={**BASE, "guard": True, "guard_window_s": 30.0, "refit_s": 60.0, "window_s": 120.0})
    row = {**run.summary(), "policy": "wa", "capacity": "200"}
    assert guard_cell(row).startswith("1 sw, 20 refits, lru ")
    tables = pop_guard_tables(row)
    assert "guard_timeline" not in row and len(tables["guard_timeline"]) == len(run.timeline) == 120
    (tmp_path / "sim").mkdir()
    write_guard_tables(tmp_path / "sim", [tables, pop_guard_tables({"policy": "lru", "capacity": "200"})])
    tl = pl.read_parquet(tmp_path / "sim" / "guard_timeline.parquet")
    assert tl["refit"].sum() == 20 and set(tl["guard_mode"]) == {"policy", "lru"}
    sw = pl.read_parquet(tmp_path / "sim" / "guard_switches.parquet")
    assert sw["to_mode"].to_list() == ["lru"] and sw["lru_hit_ratio"][0] > sw["policy_hit_ratio"][0]
    sections = guard_section.build(RunDir(tmp_path))
    assert len(sections) == 1
    s = sections[0]
    assert s.values["switches"] == "1 time" and s.values["refits"] == "20 times"  # "switched 1 time"
    assert len(s.tables["switches"].rows) == 1 and s.tables["refits"].rows
    assert guard_section.build(RunDir(tmp_path / "nothing")) == []
