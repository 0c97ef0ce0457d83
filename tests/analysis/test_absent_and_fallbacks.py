"""Traces that lack types, turns, users or sessions still analyze: the affected sections say why."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tongyi_trace.analysis import run_analyses
from tongyi_trace.run import RunDir

RunFactory = Callable[..., RunDir]

# Mooncake: ms timestamps, 512-token blocks, prefix-chained ids, nothing else.
MOONCAKE = [
    {"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]},
    {"timestamp": 1000, "input_length": 1536, "output_length": 5, "hash_ids": [1, 2, 3]},
    {"timestamp": 2500, "input_length": 512, "output_length": 5, "hash_ids": [4]},
    {"timestamp": 4000, "input_length": 1024, "output_length": 5, "hash_ids": [1, 5]},
]


def test_mooncake_sections_are_absent_with_a_reason(make_run: RunFactory) -> None:
    rep = run_analyses(make_run(MOONCAKE, "moon", infer_sessions=False))
    for name in ("request_mix", "turn_hits", "user_heatmap", "next_turn"):
        res = rep.results[name]
        assert res.status == "absent" and res.reason and "Mooncake" in res.reason, name
        assert res.tables == {}
    # hits: r1 holds [1, 2] of r0 (2 of 3), r3 holds [1] (1 of 2): 3 of 8 references
    assert rep.results["hit_ratio"].headline["hit_ratio"] == pytest.approx(3 / 8)
    assert "by_type" in rep.results["hit_ratio"].absent_parts
    assert "keys" in rep.results["skew"].absent_parts
    assert rep.results["skew"].headline["num_reuses"] == 3
    # reuse gaps: block [1] 1 s and 3 s, block [1,2] 1 s
    rt = rep.results["reuse_time"].headline
    assert rt["num_reuses"] == 3 and rt["share_within_10s"] == 1.0
    assert rep.results["lifespan"].headline["num_blocks"] == 5
    # block size 512: a block of qwen2-7b is 512 x 57344 bytes; peak live = {1, [1,2]} then {1}
    live = rep.results["live_set"].headline
    assert live["peak_live_blocks"] == 2
    assert live["models"]["qwen2-7b"]["kv_bytes_per_block"] == 512 * 57344
    summary = rep.summary()
    assert summary["analyses"]["user_heatmap"]["status"] == "absent"
    assert summary["trace"]["format"] == "mooncake"


def test_mooncake_sessions_are_inferred_by_default(make_run: RunFactory) -> None:
    """The same rows ingested as they come: r1 [1, 2, 3] starts with r0's whole prompt [1, 2] and is longer,
    so it is r0's second turn; r3 [1, 5] shares only block [1], which r0 had already gone past (a shared
    head, not a prompt of its own): a root. Turns 1, 2, 1, 1."""
    run = make_run(MOONCAKE, "moon")
    assert run.provenance()["sessions"] == "inferred"
    req = run.requests().sort("req_idx")
    assert req["parent_chat_id"].to_list() == [-1, 0, -1, -1]
    assert req["turn"].to_list() == [1, 2, 1, 1]
    assert req["category"].to_list() == ["unknown-1", "unknown-2", "unknown-1", "unknown-1"]
    rep = run_analyses(run, only="request_mix,turn_hits,next_turn")
    assert all(rep.results[n].status == "ok" for n in ("request_mix", "turn_hits", "next_turn"))
    # hits: r1 (turn 2) holds [1, 2] of r0, r3 (turn 1) holds [1]: 2 of 3 hits from a multi-turn request
    assert rep.results["turn_hits"].headline["multi_turn_hit_share"] == pytest.approx(2 / 3)
    assert rep.results["request_mix"].headline["multi_turn_share"] == pytest.approx(1 / 4)
    assert rep.results["next_turn"].headline["next_turn_prob"] == pytest.approx(1 / 4)  # r0 of 4 requests


def _bailian(rows: list[tuple[int, int, float, str, int, list[int]]], users: list[str] | None = None) -> list[dict]:
    out = []
    for i, (chat, parent, t, typ, turn, ids) in enumerate(rows):
        rec = {"chat_id": chat, "parent_chat_id": parent, "timestamp": t, "input_length": 16 * len(ids),
               "output_length": 1, "type": typ, "turn": turn, "hash_ids": ids}
        if users is not None:
            rec["user_id"] = users[i]
        out.append(rec)
    return out


def test_sessions_stand_in_for_users(make_run: RunFactory) -> None:
    rows = [(1, -1, 0.0, "text", 1, [1, 2]), (2, 1, 1.0, "text", 2, [1, 2, 3]),
            (3, -1, 2.0, "api", 1, [1, 9]), (4, 2, 3.0, "text", 3, [1, 2, 3, 4])]
    rep = run_analyses(make_run(_bailian(rows), "nouser"), only="user_heatmap,skew,request_mix")
    hm = rep.results["user_heatmap"].headline
    assert hm["key_kind"] == "session" and "sessions" in hm["key_label"]
    # session 1 (chats 1 2 4) hits 2 + 3 on itself; session 3 hits block [1] made by session 1
    assert hm["diagonal_share"] == pytest.approx(5 / 6)
    assert rep.results["skew"].headline["key_kind"] == "session"
    assert rep.results["request_mix"].headline["top10_turn_ratio"] == pytest.approx(3 / 2)


def test_users_across_sessions(make_run: RunFactory) -> None:
    # one user, two conversations sharing a system prompt [7, 8]: hits are on the diagonal for users
    rows = [(1, -1, 0.0, "text", 1, [7, 8, 1]), (2, -1, 5.0, "text", 1, [7, 8, 2]),
            (3, -1, 6.0, "text", 1, [7, 8, 3])]
    rep = run_analyses(make_run(_bailian(rows, ["a", "a", "b"]), "users"),
                       only="user_heatmap,turn_hits,next_turn")
    hm = rep.results["user_heatmap"].headline
    assert hm["key_kind"] == "user" and hm["diagonal_share"] == pytest.approx(2 / 4)
    assert rep.results["turn_hits"].headline["single_turn_hit_share"] == 1.0
    # no conversation has a second request: has_sessions is false, next_turn is absent
    assert rep.results["next_turn"].status == "absent"
