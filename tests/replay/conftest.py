"""Fixtures of the replay tests: the tiny Bailian fixture ingested once, the stand-in endpoint, and the
CLI run as a child process (kvtrace_cli)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tongyi_trace.replay.standin import StandInState, serve

KVTRACE = [sys.executable, "-m", "tongyi_trace.cli"]


def kvtrace_cli(*args: str) -> str:
    """`kvtrace ARGS` in a child process, as a user runs it; its stdout (fails the test on a non-zero exit)."""
    proc = subprocess.run([*KVTRACE, *args], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"kvtrace {' '.join(args)}: {proc.stderr.strip()[-1500:]}"
    return proc.stdout


@pytest.fixture(scope="session")
def tiny_run(tiny_bailian_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/fixtures/tiny_bailian.jsonl ingested (6 requests, 16-token blocks); replays go elsewhere."""
    from tongyi_trace.trace.ingest import ingest_trace

    out = tmp_path_factory.mktemp("tiny_run")
    ingest_trace(tiny_bailian_path, out)
    return out


@pytest.fixture
def fresh_tiny_run(tiny_run: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny run folder (each replay test writes its own replay/ artifacts)."""
    import shutil

    dst = tmp_path / "run"
    shutil.copytree(tiny_run, dst)
    return dst


@pytest.fixture
def standin() -> Iterator[Callable[..., tuple[str, StandInState]]]:
    """Factory: start a stand-in OpenAI-compatible endpoint (NOT vLLM) on a free port; stopped at teardown."""
    servers = []

    def start(**kwargs: float | str) -> tuple[str, StandInState]:
        state = StandInState(**kwargs)  # type: ignore[arg-type]
        httpd = serve(state)
        servers.append((httpd, state))
        return f"http://127.0.0.1:{httpd.server_address[1]}", state

    yield start
    for httpd, state in servers:
        state.stop.set()
        httpd.shutdown()
        httpd.server_close()
