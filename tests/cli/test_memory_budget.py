"""tongyi_trace/budget.py: what the budget derives, the one line of a memory stop (run_cli), the step it
names, and spill folders removed."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from tongyi_trace.budget import (
    BASE_BYTES,
    EXIT_CODE,
    GIB,
    MemoryBudget,
    MemoryLimitError,
    MemoryWatch,
    default_limit_gib,
    machine_memory_bytes,
    out_of_memory,
    resolve_budget,
    spill_dir,
    step,
)
from tongyi_trace.cli._common import run_cli
from tongyi_trace.errors import UsageError


def test_what_the_budget_derives() -> None:
    b = MemoryBudget(4.0)
    assert b.limit_bytes == 4 * GIB
    assert b.duckdb_gib == round((4.0 - BASE_BYTES / GIB) / 2, 2) and b.duckdb_limit == f"{int(b.duckdb_gib * 1024)}MB"
    assert MemoryBudget(0.5).duckdb_gib == 0.25  # the floor
    assert b.chunk_refs == int(4 * GIB / 16 / 96)
    assert b.parallel_tasks(GIB, GIB, 8) == 2 and b.parallel_tasks(GIB, GIB, 1) == 1
    assert b.parallel_tasks(10 * GIB, GIB, 8) == 1  # never 0: the watch stops one that does not fit
    assert 0.5 <= default_limit_gib() <= 6.0 and default_limit_gib() <= machine_memory_bytes() / GIB / 4 + 0.01
    assert resolve_budget(None).limit_gib == default_limit_gib() and resolve_budget(2).limit_gib == 2.0


@pytest.mark.parametrize("value", [0.1, -1.0, float("nan"), float("inf"), 2.0**21])
def test_bad_budgets_name_the_option(value: float) -> None:
    with pytest.raises(UsageError, match=r"^--memory-limit-gib"):
        MemoryBudget(value)


def test_out_of_memory_names_the_step() -> None:
    b = MemoryBudget(1.0)
    assert out_of_memory(ValueError("x"), b) is None
    with pytest.raises(MemoryError), step("analysis lifespan"):  # an error leaves the step named
        raise MemoryError
    e = out_of_memory(MemoryError(), b)
    assert isinstance(e, MemoryLimitError) and e.exit_code == EXIT_CODE
    assert str(e).startswith("analysis lifespan: needs more memory than --memory-limit-gib 1;")
    with step("simulate lru @ 1L"):
        assert "--jobs 1" in str(out_of_memory(MemoryError(), b))
        assert "--memory-limit-gib" not in str(out_of_memory(MemoryError(), None))  # a command without it


def test_run_cli_turns_memory_errors_into_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def boom() -> None:
        with step("fit: reuse samples"):
            raise MemoryError

    with pytest.raises(typer.Exit) as ex:
        run_cli(boom, MemoryBudget(2.0))
    assert ex.value.exit_code == EXIT_CODE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: fit: reuse samples: needs more memory than --memory-limit-gib 2")
    with pytest.raises(ZeroDivisionError):  # anything else goes on as it was
        run_cli(lambda: 1 // 0, MemoryBudget(2.0))


def test_watch_keeps_the_peak_and_spill_folders_go(tmp_path: Path) -> None:
    with MemoryWatch(MemoryBudget(64.0)) as w:
        block = bytearray(64 << 20)  # touched: resident
        block[::4096] = b"x" * len(block[::4096])
        import time

        time.sleep(0.3)
    assert w.peak_bytes >= 64 << 20 and w.used_bytes() > 0
    with spill_dir(tmp_path / "spill") as d:
        (d / "f").write_text("x")
    assert not (tmp_path / "spill").exists()
