"""Shared fixtures: paths to the real public traces beside the checkout, tiny hand-made traces."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.lanes import timeout_s, worker_group

# Property tests draw the same examples on every run (a failure reproduces; CI is not a lottery), with no
# per-example deadline (the machine is shared: time is not what they check). tests/lanes.py registers the
# profiles: `kvtrace` (every example, the default) and `kvtrace-fast` (make test's lane).
settings.load_profile("kvtrace")

# pytest-xdist's workers run with COLUMNS=80 LINES=24 set; kvtrace's output to a pipe takes its natural width
# only when COLUMNS is unset (tests/cli/test_redirected_output.py), so a worker would cut tables at 80 columns.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give every test without its own timeout the one of its markers, and its group for parallel workers
    (tests/lanes.py: `make test` runs two, `-n 2 --dist loadgroup`)."""
    for item in items:
        markers = {m.name for m in item.iter_markers()}
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(timeout_s(markers)))
        if "PYTEST_XDIST_WORKER" in os.environ:  # groups matter to xdist workers only (`-p no:xdist` has none)
            item.add_marker(pytest.mark.xdist_group(worker_group(item.nodeid, markers, set(item.fixturenames))))

REPO = Path(__file__).resolve().parent.parent
SHARED_TRACES = REPO.parent / "shared" / "traces"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _shared_trace(name: str) -> Path:
    path = SHARED_TRACES / name
    if not path.is_file():
        pytest.skip(f"{path} is absent: the public Mooncake traces live in ../shared/traces beside the checkout")
    return path


@pytest.fixture(scope="session")
def mooncake_conversation_path() -> Path:
    """../shared/traces/mooncake_conversation.jsonl (skips when absent)."""
    return _shared_trace("mooncake_conversation.jsonl")


@pytest.fixture(scope="session")
def mooncake_synthetic_path() -> Path:
    """../shared/traces/mooncake_synthetic.jsonl (skips when absent)."""
    return _shared_trace("mooncake_synthetic.jsonl")


@pytest.fixture(scope="session")
def mooncake_conversation_run(mooncake_conversation_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The conversation trace ingested once per test session; returns the run folder."""
    from tongyi_trace.trace.ingest import ingest_trace

    out = tmp_path_factory.mktemp("mooncake_conversation_run")
    ingest_trace(mooncake_conversation_path, out)
    return out


@pytest.fixture
def private_run(tmp_path: Path) -> Callable[[Path], Path]:
    """A private copy of a shared run folder's ingested tables (no results), for a test that writes results:
    session fixtures stay as their first test saw them, so tests run in any order and in parallel."""
    import shutil

    def copy(run: Path) -> Path:
        out = tmp_path / f"private-{run.name}"
        out.mkdir()
        for name in ("provenance.json", "requests.parquet", "blocks.parquet"):
            shutil.copy2(run / name, out / name)
        return out
    return copy


@pytest.fixture(scope="session")
def tiny_bailian_path() -> Path:
    """tests/fixtures/tiny_bailian.jsonl: 6 hand-made Bailian requests (see the file's comment in README)."""
    return FIXTURES / "tiny_bailian.jsonl"


# ---- BEGIN engine fixture (owned by the replay area, issue 6) -----------------------------------------
# The real CPU vLLM engine for tests marked `engine`: started once per session with `kvtrace engine start`
# (a few hundred KV blocks, so evictions happen) and stopped at the end. `make vllm-engine` installs it.
ENGINE_NUM_BLOCKS = 300
ENGINE_BLOCK_SIZE = 32
ENGINE_MAX_MODEL_LEN = 2048


def _session_engine(name: str, *args: str) -> Iterator[dict[str, Any]]:
    """`kvtrace engine start --name NAME --json ARGS` for the test session: yields the state it printed (url,
    pid, num_blocks...) and stops the engine at the end."""
    import json
    import subprocess
    import sys

    from tongyi_trace.engine.install import is_installed

    if not is_installed():
        pytest.fail("the CPU vLLM engine is not installed: run 'make vllm-engine' (kvtrace engine install)")
    kvtrace = [sys.executable, "-m", "tongyi_trace.cli"]
    proc = subprocess.run([*kvtrace, "engine", "start", "--name", name, "--json", *args],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.fail(f"kvtrace engine start {' '.join(args)} failed: {proc.stderr.strip()[-2000:]}")
    try:
        yield json.loads(proc.stdout)
    finally:
        subprocess.run([*kvtrace, "engine", "stop", "--name", name, "--quiet"], check=False)


@pytest.fixture(scope="session")
def cpu_engine() -> Iterator[dict[str, Any]]:
    """A running CPU vLLM server (token-id prompts only): the state `kvtrace engine start --json` printed."""
    yield from _session_engine(f"pytest-{os.getpid()}", "--num-blocks", str(ENGINE_NUM_BLOCKS), "--block-size",
                               str(ENGINE_BLOCK_SIZE), "--max-model-len", str(ENGINE_MAX_MODEL_LEN))


@pytest.fixture(scope="session")
def tok_engine() -> Iterator[dict[str, Any]]:
    """A running CPU vLLM server that tokenizes (`kvtrace engine start --tokenizer`: /tokenize and chat
    completions), 256 blocks of 32 tokens: its state as --json printed."""
    yield from _session_engine(f"pytest-tok-{os.getpid()}", "--tokenizer", "--num-blocks", "256", "--block-size",
                               str(ENGINE_BLOCK_SIZE), "--max-model-len", "4096")
# ---- END engine fixture -----------------------------------------------------------------------------------
