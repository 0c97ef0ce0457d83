"""Engine fixtures of the plugin tests: a hand-written valid policy, servers that are always stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tongyi_trace.replay import engine

# text-2 blocks are almost surely reused for a long time; text-1 blocks almost never; others between.
HAND_POLICY = {
    "schema": "kvtrace.policy/1",
    "categories": {
        "text-2": {"reuse_prob": 0.9, "rate_per_s": 0.01, "life_s": 600.0},
        "text-1": {"reuse_prob": 0.05, "rate_per_s": 1.0, "life_s": 1.0},
    },
    "default": {"reuse_prob": 0.3, "rate_per_s": 0.1, "life_s": 10.0},
}


def require_engine() -> None:
    """Skip with the reason when the CPU vLLM engine is not installed (`make test` installs it)."""
    if not engine.is_installed():
        pytest.skip("the CPU vLLM engine is not installed: run 'make vllm-engine' (kvtrace engine install)")


@pytest.fixture()
def hand_policy(tmp_path: Path) -> Path:
    """A valid kvtrace.policy/1 file written by hand."""
    p = tmp_path / "policy.json"
    p.write_text(json.dumps(HAND_POLICY))
    return p
