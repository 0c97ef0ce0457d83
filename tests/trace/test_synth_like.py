"""`kvtrace synth --like policy.json` and `workload_summary` (issue 4).

Golden workload on the tiny fixture; the generator's structure (every block of a request is carried
by its next turn, whole blocks only, no cross-session sharing); bad policy files; and the round trip
fit(synth --like fit(T)) ~ fit(T): lambda within 10% and p within 0.05 for well-sampled categories."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tongyi_trace.cli import app
from tongyi_trace.errors import InputError
from tongyi_trace.fit.params import CategoryParams, PolicyParams, load_policy, save_policy
from tongyi_trace.fit.policy_fit import fit_policy
from tongyi_trace.run import RunDir
from tongyi_trace.trace.ingest import ingest_trace
from tongyi_trace.trace.synth import synth_to_file
from tongyi_trace.trace.synth_like import QUANTILE_LEVELS, WORKLOAD_SCHEMA, synth_like, workload_summary

runner = CliRunner()


def test_workload_summary_golden_on_tiny_fixture(tiny_bailian_path: Path, tmp_path: Path) -> None:
    ingest_trace(tiny_bailian_path, tmp_path)
    wl = workload_summary(RunDir(tmp_path))
    assert wl["schema"] == WORKLOAD_SCHEMA and wl["block_size"] == 16
    assert (wl["num_requests"], wl["num_sessions"], wl["num_users"]) == (6, 3, 3)
    assert wl["duration_s"] == 30.0 and wl["request_rate_per_s"] == pytest.approx(0.2)
    assert wl["type_share"] == pytest.approx({"search": 1 / 6, "text": 5 / 6})
    assert wl["first_turn_type_share"] == pytest.approx({"search": 1 / 3, "text": 2 / 3})
    assert wl["turn_share"] == pytest.approx({"1": 0.5, "2": 1 / 6, "3": 1 / 6, "4": 1 / 6})
    assert wl["multi_turn_share"] == 0.5
    text = wl["lengths"]["text"]
    # first turns 40, 32 tokens; later turns add 64-(40+10)=14, 80-(64+8)=8, 96-(80+4)=12
    assert (text["first_input_tokens"][0], text["first_input_tokens"][-1]) == (32, 40)
    assert text["next_input_tokens"][5] == 12 and text["next_input_tokens"][0] == 8
    assert sorted(set(text["output_tokens"]) & {2.0, 10.0}) == [2.0, 10.0]
    assert wl["lengths"]["search"]["next_input_tokens"] == []
    assert sum(wl["session_rate_shape"]) == 3
    # first turns with a shared first block: chat 2 starts with chat 1's block 1; chat 4 starts with 2
    assert wl["first_turn_prefix_hit_share"] == pytest.approx(1 / 3)


def _policy(tmp_path: Path, cats: dict[str, tuple[float, float]], num_requests: int = 4000) -> Path:
    levels = list(QUANTILE_LEVELS)
    lengths = {"text": {"first_input_tokens": list(np.linspace(20, 400, len(levels))),
                        "next_input_tokens": list(np.linspace(5, 100, len(levels))),
                        "output_tokens": list(np.linspace(1, 300, len(levels)))}}
    workload = {"schema": WORKLOAD_SCHEMA, "block_size": 16, "num_requests": num_requests,
                "num_users": 50, "duration_s": 3600.0, "session_rate_shape": [1, 1],
                "first_turn_type_share": {"text": 1.0}, "quantile_levels": levels, "lengths": lengths}

    def cp(p: float, lam: float) -> CategoryParams:
        return CategoryParams(reuse_prob=p, rate_per_s=lam, mean_reuse_s=1 / lam, life_s=600.0)

    policy = PolicyParams(categories={k: cp(*v) for k, v in cats.items()}, default=cp(0.5, 0.01),
                          extra={"workload": workload})
    path = tmp_path / "policy.json"
    save_policy(policy, path)
    return path


def test_like_trace_structure(tmp_path: Path) -> None:
    path = _policy(tmp_path, {"text-1": (0.6, 1 / 30), "text-2": (0.5, 1 / 60), "text-3+": (0.3, 1 / 90)})
    _, tr = synth_like(path, 3)
    assert tr.num_requests == 4000
    assert np.all(tr.input_tokens % 16 == 0)  # whole blocks: a child carries every block of its parent
    assert tr.arrival_ms.max() < 3_600_000
    assert set(np.unique(tr.user)) <= set(range(50))
    blocks = [tr.hash_ids[tr.offsets[i]:tr.offsets[i + 1]] for i in range(tr.num_requests)]
    owner: dict[int, int] = {}
    for i in range(tr.num_requests):
        p = int(tr.parent_chat_id[i])
        if p >= 0:
            assert np.array_equal(blocks[i][:blocks[p].size], blocks[p])
            assert tr.input_tokens[i] >= tr.input_tokens[p] + tr.output_tokens[p] + 1
        root = i if p < 0 else owner[p]
        owner[i] = root
    # no block is shared between two sessions
    first_owner: dict[int, int] = {}
    for i, b in enumerate(blocks):
        for x in b.tolist():
            assert first_owner.setdefault(x, owner[i]) == owner[i]
    # turn continuation follows p: P(turn 2 | turn 1) ~ 0.6 (minus sessions cut by the trace end)
    n1, n2 = np.sum(tr.turn == 1), np.sum(tr.turn == 2)
    assert 0.5 < n2 / n1 < 0.62


def test_like_is_deterministic_and_cli_runs(tmp_path: Path) -> None:
    path = _policy(tmp_path, {"text-1": (0.5, 1 / 20)}, num_requests=600)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for out in (a, b):
        res = runner.invoke(app, ["synth", "--like", str(path), "--seed", "9", "-o", str(out), "--json"])
        assert res.exit_code == 0, res.output
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(res.stdout)["num_requests"] == 600
    res = runner.invoke(app, ["synth", "--like", str(path), "--profile", "to-c", "-o", str(a)])
    assert res.exit_code == 2 and "exactly one of" in res.output


def test_like_needs_a_workload(tmp_path: Path) -> None:
    path = _policy(tmp_path, {"text-1": (0.5, 0.1)})
    doc = json.loads(path.read_text())
    del doc["workload"]
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="workload"):
        synth_like(path, 1)
    res = runner.invoke(app, ["synth", "--like", str(path), "-o", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 2 and "workload" in res.output and "Traceback" not in res.output


@pytest.mark.slow
def test_round_trip_fit_synth_like_fit(tmp_path: Path) -> None:
    """fit(synth --like fit(T)) ~ fit(T) for T = the to-C profile (a third of the default size); the
    --like trace has 3x T's requests so that each category's estimate rests on enough conversations."""
    trace = tmp_path / "t.jsonl"
    synth_to_file("to-c", 21, trace, scale=1 / 3)
    ingest_trace(trace, tmp_path / "run_t")
    fit_policy(tmp_path / "run_t", tmp_path / "p1.json")
    like = tmp_path / "like.jsonl"
    from tongyi_trace.trace.synth_like import synth_like_to_file

    synth_like_to_file(tmp_path / "p1.json", 22, like, scale=3.0)
    ingest_trace(like, tmp_path / "run_like")
    fit_policy(tmp_path / "run_like", tmp_path / "p2.json")
    p1, p2 = load_policy(tmp_path / "p1.json"), load_policy(tmp_path / "p2.json")
    checked = []
    for name, c1 in p1.categories.items():
        if c1.fallback or c1.num_samples < 2000:
            continue
        c2 = p2.categories[name]
        assert abs(c2.rate_per_s / c1.rate_per_s - 1) <= 0.10, (name, c1, c2)
        assert abs(c2.reuse_prob - c1.reuse_prob) <= 0.05, (name, c1, c2)
        checked.append(name)
    assert len(checked) >= 9, checked
