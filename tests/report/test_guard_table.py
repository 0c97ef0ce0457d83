"""The simulation section's guard table: one row per guarded run (WA first, then fitted, each in capacity
order), the ablation's variants and unguarded rows left out, none for a sweep without guard columns."""

from __future__ import annotations

import polars as pl

from tongyi_trace.report.sections.sim import _guard_table

CAPS = pl.DataFrame({"capacity": ["0.5L", "2L"], "capacity_blocks": [500, 2000]})


def _row(policy: str, capacity: str, switches: int | None, policy_s: float | None,
         lru_s: float | None) -> dict[str, object]:
    return {"policy": policy, "capacity": capacity, "guard_switches": switches, "refits": 0,
            "guard_time_policy_s": policy_s, "guard_time_lru_s": lru_s}


def test_guarded_runs_only_with_their_time_in_lru_order() -> None:
    results = pl.DataFrame([
        _row("fitted", "0.5L", 0, 7200.0, 0.0),
        _row("wa", "2L", 0, 7200.0, 0.0),
        _row("wa", "0.5L", 1, 1800.0, 5400.0),
        _row("wa-no-life", "0.5L", 1, 1800.0, 5400.0),  # an ablation variant: its guard acts as WA's
        _row("lru", "0.5L", None, None, None),  # not guarded
    ])
    table = _guard_table(results, CAPS)
    assert table is not None
    assert table.rows == [["wa", "0.5L", "1", "0", "75.0%"], ["wa", "2L", "0", "0", "0.0%"],
                          ["fitted", "0.5L", "0", "0", "0.0%"]]


def test_no_table_without_guarded_rows() -> None:
    assert _guard_table(pl.DataFrame([_row("lru", "2L", None, None, None)]), CAPS) is None
    assert _guard_table(pl.DataFrame({"policy": ["lru"], "capacity": ["2L"]}), CAPS) is None
