"""The README a newcomer opens: the quick start first (the two make commands, then five commands on one's own
trace), a command table of one-line cells that link to docs/ for the details, the calibration bands after."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def test_quick_start_comes_first() -> None:
    headings = re.findall(r"^## (.+)$", README, re.M)
    assert headings[:3] == ["Quick start", "Commands", "Calibration of the synthetic traces"]
    quick = _section("Quick start")
    assert "make demo" in quick and "make test" in quick
    own = re.findall(r"^kvtrace (\w+) ", quick, re.M)
    assert own == ["ingest", "analyze", "fit", "simulate", "report"]
    assert README.index("holds all 10 of its bands") > README.index("## Quick start")


def test_the_command_table_has_one_line_cells_linking_to_details() -> None:
    rows = [line for line in _section("Commands").splitlines() if line.startswith("| `kvtrace")]
    assert len(rows) >= 12
    for row in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        assert len(cells) == 3 and all(len(c) <= 130 for c in cells), row
        for target in re.findall(r"\]\(([^)#]+)", cells[2]):
            assert (ROOT / target).is_file(), target
