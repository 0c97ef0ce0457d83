"""A mistyped option, value or command is one line naming it and where the help is (exit 2)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(("args", "needle"), [
    (["ingest", "t.jsonl", "--block-size", "1e20"], "Invalid value for '--block-size'"),
    (["simulate", "--bogus"], "No such option: --bogus"),
    (["nosuch"], "No such command 'nosuch'"),
])
def test_usage_errors_are_one_line(args: list[str], needle: str) -> None:
    out = subprocess.run([sys.executable, "-m", "tongyi_trace.cli", *args], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "--help'" in lines[0] and "Traceback" not in out.stderr
