"""`kvtrace engine` without starting a server: option checks, the not-installed error, stop/status of
an engine that does not run (an empty cache folder via KVTRACE_CACHE_DIR)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tongyi_trace.cli import app


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def _run(tmp_path: Path, *args: str) -> Result:
    r = CliRunner().invoke(app, list(args), env={"KVTRACE_CACHE_DIR": str(tmp_path / "cache")})
    return Result(r.exit_code, r.stdout, r.stderr)


@pytest.mark.parametrize(("args", "message"), [
    (["--block-size", "48"], "multiple of 32"),
    (["--num-blocks", "10", "--max-model-len", "4096"], "vLLM refuses to start"),
    (["--eviction", "wa"], "needs --policy"),
    (["--eviction", "clock"], "wa, lru, fifo, s3fifo"),
    (["--policy", "missing.json"], "no such file"),
    ([], "not installed; run 'kvtrace engine install'"),
])
def test_start_refuses_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    proc = _run(tmp_path, "engine", "start", "--name", "t", *args)
    assert proc.returncode != 0
    assert message in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "cache" / "engine" / "state" / "t" / "engine.json").exists()


def test_stop_and_status_of_an_engine_that_does_not_run(tmp_path: Path) -> None:
    proc = _run(tmp_path, "engine", "stop", "--name", "none", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"schema": "kvtrace.engine-stop/1", "stopped": False,
                                                          "pid": None, "url": None}
    proc = _run(tmp_path, "engine", "status", "--name", "none")
    assert proc.returncode == 1 and "not running (installed: no)" in proc.stdout
    proc = _run(tmp_path, "engine", "status", "--name", "none", "-q")
    assert proc.returncode == 1 and proc.stdout == ""
    # The exit code does not depend on the output form: a script may test it and read the document.
    proc = _run(tmp_path, "engine", "status", "--name", "none", "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout) == {
        "schema": "kvtrace.engine-status/1", "name": "none", "running": False, "healthy": False,
        "installed": False, "state": None}


def test_a_stale_pid_file_is_not_trusted(tmp_path: Path) -> None:
    # The recorded pid is this test's own python: alive, but not a vLLM server on that port.
    state = tmp_path / "cache" / "engine" / "state" / "stale"
    state.mkdir(parents=True)
    (state / "engine.json").write_text(json.dumps({
        "name": "stale", "pid": os.getpid(), "port": 1, "url": "http://127.0.0.1:1", "log_path": "x",
        "model_dir": "x", "served_model_name": "m", "num_blocks": 1, "block_size": 32, "max_model_len": 32,
        "eviction": None, "policy": None, "started_at": 0.0, "command": []}))
    proc = _run(tmp_path, "engine", "status", "--name", "stale", "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["running"] is False
    proc = _run(tmp_path, "engine", "stop", "--name", "stale", "--json")
    assert proc.returncode == 0 and not (state / "engine.json").exists()
