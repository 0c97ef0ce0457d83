"""`kvtrace report`: where it writes, --json, and the one-line error on a folder that is not a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tongyi_trace.cli import app
from tongyi_trace.errors import UsageError
from tongyi_trace.report import screenshot
from tongyi_trace.run import RunDir


def test_report_writes_into_the_run_folder_and_says_where(bare_run: RunDir) -> None:
    res = CliRunner().invoke(app, ["report", str(bare_run.path), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out == {"schema": "kvtrace.report-output/1", "report": str(bare_run.path / "report.html"),
                   "screenshot": None, "sweep": None}  # no simulator sweep in a bare run
    assert Path(out["report"]).read_text().startswith("<!DOCTYPE html>")


def test_report_to_another_file(bare_run: RunDir, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.html"
    res = CliRunner().invoke(app, ["report", str(bare_run.path), "-o", str(target), "--quiet"])
    assert res.exit_code == 0 and res.stdout == ""
    assert target.is_file()


def test_not_a_run_folder_is_a_one_line_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 2
    assert "not a kvtrace run folder" in res.stderr and "kvtrace ingest" in res.stderr
    assert "Traceback" not in res.output


def test_screenshot_of_a_missing_report_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"missing\.html: no such report; run 'kvtrace report RUN_DIR' first"):
        screenshot(tmp_path / "missing.html", tmp_path / "shot.png")
