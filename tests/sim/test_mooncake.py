"""Cross-checks against the figures in ../shared/traces/README.md (skipped when the traces are absent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tongyi_trace.run import open_run
from tongyi_trace.sim.lru_curve import lru_curve
from tongyi_trace.sim.simulate import simulate_policy
from tongyi_trace.sim.stream import Stream, load_stream, stream_from_lists


def _mooncake_stream(path: Path) -> Stream:
    """The trace's hash_ids are prefix-chained already: use them as chain ids, 512-token blocks."""
    reqs, toks, times = [], [], []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        ids = d["hash_ids"]
        reqs.append(ids)
        toks.append([512] * (len(ids) - 1) + [d["input_length"] - 512 * (len(ids) - 1)])
        times.append(d["timestamp"] / 1000)
    return stream_from_lists(reqs, num_tokens=toks, times_s=times, block_size=512)


@pytest.fixture(scope="module")
def conversation(mooncake_conversation_path: Path) -> Stream:
    return _mooncake_stream(mooncake_conversation_path)


def test_conversation_lru_matches_readme(conversation: Stream) -> None:
    assert (conversation.num_requests, conversation.num_refs, conversation.num_ids) == (12031, 288500, 182790)
    assert conversation.ideal_hits() / conversation.num_refs == pytest.approx(0.3664, abs=1e-4)
    curve = lru_curve(conversation)
    for cap, expected in [(2000, 0.0543), (8000, 0.1781), (32000, 0.3320)]:
        sim = simulate_policy(conversation, "lru", cap)
        assert sim.hit_ratio == pytest.approx(expected, abs=0.001)
        assert curve.hits(cap) == sim.num_hits


def test_synthetic_lru_matches_readme(mooncake_synthetic_path: Path) -> None:
    s = _mooncake_stream(mooncake_synthetic_path)
    assert s.ideal_hits() / s.num_refs == pytest.approx(0.6396, abs=1e-4)
    curve = lru_curve(s)
    for cap, expected in [(1000, 0.0841), (4000, 0.2345), (16000, 0.5299)]:
        assert curve.hit_ratio(cap) == pytest.approx(expected, abs=0.001)


@pytest.mark.slow
def test_ingested_run_gives_the_same_stream(mooncake_conversation_run: Path, conversation: Stream) -> None:
    s = load_stream(open_run(mooncake_conversation_run).tables())
    assert (s.num_refs, s.num_ids) == (conversation.num_refs, conversation.num_ids)
    assert lru_curve(s).hits(8000) == lru_curve(conversation).hits(8000)
