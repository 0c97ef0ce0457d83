"""scripts/demo.sh (`make demo`) ends with the report's two paths, each said once: by `kvtrace report` itself
(it printed them, then the script printed them again)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from tongyi_trace.cli import app

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_leaves_the_paths_to_kvtrace_report() -> None:
    script = (ROOT / "scripts" / "demo.sh").read_text()
    code = "\n".join(line.split("#", 1)[0] for line in script.splitlines())  # comments aside
    assert not re.findall(r"(printf|echo)[^\n]*(report|screenshot):", code)
    assert re.findall(r'\$K report "\$OUT/run" --screenshot', code)


def test_report_says_each_path_once(tiny_bailian_path: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["ingest", str(tiny_bailian_path), "-o", str(tmp_path / "run"), "-q"]).exit_code == 0
    result = runner.invoke(app, ["report", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert result.output.count("report:") == 1 and str((tmp_path / "run" / "report.html").resolve()) in result.output
    doc = json.loads(runner.invoke(app, ["report", str(tmp_path / "run"), "--json"]).stdout)
    assert doc["report"] == str((tmp_path / "run" / "report.html").resolve())
