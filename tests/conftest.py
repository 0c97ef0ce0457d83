"""Shared fixtures: paths to the real public traces beside the checkout, tiny hand-made traces."""

from __future__ import annotations

from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def tiny_bailian_path() -> Path:
    """tests/fixtures/tiny_bailian.jsonl: 6 hand-made Bailian requests (see the file's comment in README)."""
    return FIXTURES / "tiny_bailian.jsonl"
