"""`kvtrace synth --like X` and `workload_summary`.

Golden workload on the tiny fixture; X as a workload.json, a run folder (with and without
fit/workload.json) and an older policy file embedding "workload"; one-line errors for bad workload
files; and the round trip: the workload of `synth --like` follows the workload it was given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from tongyi_trace.cli import app
from tongyi_trace.errors import InputError
from tongyi_trace.run import RunDir
from tongyi_trace.trace.ingest import ingest_trace
from tongyi_trace.trace.synth import synth_to_file
from tongyi_trace.trace.synth_like import (
    QUANTILE_LEVELS,
    WORKLOAD_SCHEMA,
    load_workload,
    synth_like,
    synth_like_to_file,
    workload_summary,
)

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


def _workload(num_requests: int = 3000) -> dict[str, Any]:
    levels = list(QUANTILE_LEVELS)
    lengths = {"text": {"first_input_tokens": list(np.geomspace(20, 4000, len(levels))),
                        "next_input_tokens": list(np.geomspace(5, 500, len(levels))),
                        "output_tokens": list(np.geomspace(10, 2000, len(levels)))}}
    return {"schema": WORKLOAD_SCHEMA, "block_size": 16, "num_requests": num_requests, "num_users": 200,
            "duration_s": 3600.0, "session_rate_shape": [1, 3], "first_turn_type_share": {"text": 1.0},
            "turn_share": {"1": 0.6, "2": 0.25, "3": 0.15}, "quantile_levels": levels, "lengths": lengths,
            "first_turn_prefix_hit_share": 0.2}


def test_like_accepts_workload_run_folder_and_old_policy(tmp_path: Path) -> None:
    wl = _workload()
    (tmp_path / "workload.json").write_text(json.dumps(wl))
    (tmp_path / "policy.json").write_text(json.dumps({"schema": "kvtrace.policy/1", "workload": wl}))
    run = tmp_path / "run"
    (run / "fit").mkdir(parents=True)
    (run / "fit" / "workload.json").write_text(json.dumps(wl))
    traces = [synth_like(src, 3)[1] for src in (tmp_path / "workload.json", tmp_path / "policy.json", run)]
    for tr in traces:
        assert np.array_equal(tr.hash_ids, traces[0].hash_ids)
    tr = traces[0]
    assert tr.num_requests == 3000 and tr.arrival_ms.max() < 3_600_000
    assert set(np.unique(tr.user)) <= set(range(200))
    # the session rate shape: three times as many conversations open in the second half
    roots = tr.arrival_ms[tr.parent_chat_id < 0]
    assert 2.3 < np.sum(roots >= 1_800_000) / np.sum(roots < 1_800_000) < 3.7


def test_like_on_a_run_without_fit_computes_the_workload(tiny_bailian_path: Path, tmp_path: Path) -> None:
    ingest_trace(tiny_bailian_path, tmp_path / "run")
    wl = load_workload(tmp_path / "run")
    assert (wl.num_requests, wl.duration_s, wl.num_users) == (6, 30.0, 3)
    _, tr = synth_like(tmp_path / "run", 1, num_requests=50)
    assert tr.num_requests == 50 and set(tr.type_names) == {"search", "text"}


def test_like_is_deterministic_and_cli_runs(tmp_path: Path) -> None:
    path = tmp_path / "workload.json"
    path.write_text(json.dumps(_workload(600)))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for out in (a, b):
        res = runner.invoke(app, ["synth", "--like", str(path), "--seed", "9", "-o", str(out), "--json"])
        assert res.exit_code == 0, res.output
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(res.stdout)["num_requests"] == 600
    res = runner.invoke(app, ["synth", "--like", str(path), "--profile", "to-c", "-o", str(a)])
    assert res.exit_code == 2 and "exactly one of" in res.output


def test_like_says_when_the_measured_trace_had_other_blocks(tmp_path: Path) -> None:
    """A 512-token-block source (Mooncake) gives 16-token blocks: 32x the block counts, said in one line."""
    path = tmp_path / "workload.json"
    for block_size, note in ((512, True), (16, False)):
        path.write_text(json.dumps({**_workload(200), "block_size": block_size}))
        res = runner.invoke(app, ["synth", "--like", str(path), "-o", str(tmp_path / "t.jsonl"), "--json"])
        doc = json.loads(res.stdout)
        assert (doc["block_size"], doc["source_block_size"]) == (16, block_size)
        res = runner.invoke(app, ["synth", "--like", str(path), "-o", str(tmp_path / "t.jsonl")])
        assert res.exit_code == 0 and ("block counts are 32x finer" in res.output) == note, res.output
    res = runner.invoke(app, ["synth", "--profile", "to-c", "--requests", "50", "-o", str(tmp_path / "p.jsonl"),
                              "--json"])
    assert json.loads(res.stdout)["source_block_size"] is None


@pytest.mark.parametrize("edit, field", [
    ({"num_requests": "5"}, "'num_requests' must be a number"),
    ({"duration_s": float("inf")}, "'duration_s' must be a finite number"),
    ({"num_requests": 5e20}, "'num_requests' must be an integer in [1, 2e+07]"),
    ({"num_users": -3}, "'num_users'"),
    ({"turn_buckets": [3, 1, 2]}, "'turn_buckets' must be strictly ascending"),
    ({"turn_buckets": [-1, 2]}, "'turn_buckets[0]'"),
    ({"quantile_levels": [0.5, 0.1]}, "'quantile_levels'"),
    ({"first_turn_type_share": {}}, "'first_turn_type_share'"),
    ({"lengths": {"text": {"output_tokens": [1.0] * 10 + [1.2e17]}}}, "'lengths.text.output_tokens[10]'"),
    ({"turn_share": {"x": 0.5}}, "'turn_share.x'"),
    ({"schema": "kvtrace.other/1"}, "'schema'"),
])
def test_bad_workload_files_are_one_line_errors(tmp_path: Path, edit: dict[str, Any], field: str) -> None:
    path = tmp_path / "workload.json"
    path.write_text(json.dumps({**_workload(), **edit}))  # json.dumps writes inf as Infinity
    with pytest.raises(InputError, match=r"workload\.json: field") as e:
        synth_like(path, 1)
    assert field in str(e.value) and "\n" not in str(e.value)
    res = runner.invoke(app, ["synth", "--like", str(path), "-o", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_policy_without_workload_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"schema": "kvtrace.policy/1", "categories": {}}))
    with pytest.raises(InputError, match="field 'workload' is missing"):
        synth_like(path, 1)


@pytest.mark.slow
def test_round_trip_workload_of_like_follows_the_workload(tmp_path: Path) -> None:
    """workload(synth --like workload(T)) ~ workload(T) for T = the to-C profile (a quarter size)."""
    synth_to_file("to-c", 21, tmp_path / "t.jsonl", scale=0.25)
    ingest_trace(tmp_path / "t.jsonl", tmp_path / "run_t")
    synth_like_to_file(tmp_path / "run_t", 22, tmp_path / "like.jsonl")
    ingest_trace(tmp_path / "like.jsonl", tmp_path / "run_like")
    w1, w2 = workload_summary(RunDir(tmp_path / "run_t")), workload_summary(RunDir(tmp_path / "run_like"))
    assert w2["num_requests"] == w1["num_requests"]
    for ty, share in w1["first_turn_type_share"].items():
        assert w2["first_turn_type_share"][ty] == pytest.approx(share, abs=0.02)
        for key in ("first_input_tokens", "output_tokens"):
            assert w2["lengths"][ty][key][5] == pytest.approx(w1["lengths"][ty][key][5], rel=0.2), (ty, key)
    assert w2["multi_turn_share"] == pytest.approx(w1["multi_turn_share"], abs=0.08)
    assert w2["turn_share"]["2"] == pytest.approx(w1["turn_share"]["2"], abs=0.05)
