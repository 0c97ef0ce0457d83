"""docs/cli.md's command reference is the commands' current --help (`make docs` rewrites it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_cli_docs.py"


def _check(doc: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--check", "--doc", str(doc)], capture_output=True,
                          text=True, cwd=ROOT, check=False)


def test_cli_reference_is_current() -> None:
    proc = _check(ROOT / "docs" / "cli.md")
    assert proc.returncode == 0, proc.stderr


def test_a_stale_reference_is_caught_and_rewritten(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    # every command and subcommand has its section, with its real usage line
    for cmd in ("ingest", "export", "synth", "analyze", "report", "fit", "simulate", "engine start",
                "engine install", "engine stop", "engine status", "replay", "compare", "study"):
        assert f"### `kvtrace {cmd}`\n\n```text\nUsage: kvtrace {cmd} [OPTIONS]" in text
    assert "--cost-from" in text and "--vocab-size" in text
    stale = tmp_path / "cli.md"
    stale.write_text(text.replace("--cost-from", "--cost-form", 1), encoding="utf-8")
    proc = _check(stale)
    assert proc.returncode == 1 and "not current; run 'make docs'" in proc.stderr
    subprocess.run([sys.executable, str(SCRIPT), "--doc", str(stale)], check=True, capture_output=True)
    assert stale.read_text(encoding="utf-8") == text
    # the hand-written conventions before the reference are kept
    head = text.split("<!-- BEGIN", 1)[0]
    assert head.startswith("# CLI conventions") and head.strip()
