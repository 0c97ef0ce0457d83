"""The vocabulary prompt token ids are drawn from: read from the server when it says (vLLM's /tokenizer_info,
served with --enable-tokenizer-info-endpoint: its first special token's id), else the 32,000 default with a
note; --vocab-size wins. Against the stand-in endpoint, which answers /tokenizer_info only when told to."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tongyi_trace.replay.runner import ReplayOptions, run_replay
from tongyi_trace.replay.schedule import ScheduleOptions
from tongyi_trace.replay.standin import StandInState

Standin = Callable[..., tuple[str, StandInState]]
FAST = ScheduleOptions(speedup=1000.0)


def test_the_server_says_its_vocabulary(fresh_tiny_run: Path, standin: Standin) -> None:
    url, state = standin(block_size=32, first_special_id=300)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="v", schedule=FAST))
    assert res.summary["vocab"] == {"size": 300, "source": "the server's /tokenizer_info (its first special token id)"}
    assert 100 <= state.max_token_id < 300  # every prompt token an ordinary one: [--min-token-id, 300)


def test_a_silent_server_gets_the_default_with_a_note(fresh_tiny_run: Path, standin: Standin) -> None:
    url, state = standin(block_size=32)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="d", schedule=FAST))
    assert res.summary["vocab"] == {"size": 32000,
                                    "source": "default 32000 (the server did not say; pass --vocab-size)"}
    assert 300 <= state.max_token_id < 32000  # the seeded draws over [100, 32000) reach far past 300


def test_the_option_wins(fresh_tiny_run: Path, standin: Standin) -> None:
    url, state = standin(block_size=32, first_special_id=300)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="o", vocab_size=200, schedule=FAST))
    assert res.summary["vocab"] == {"size": 200, "source": "--vocab-size"}
    assert state.max_token_id < 200
