"""`kvtrace synth --like X` and `workload_summary`.

Golden workload on the tiny fixture; X as a workload.json, a run folder and a policy file embedding
"workload"; the twin written in the run's block size; one-line errors for bad workload files and a
clear one for a kvtrace.workload/1 file. The twin's figures against real runs: tests/calibration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from tongyi_trace.cli import app
from tongyi_trace.errors import InputError
from tongyi_trace.fit.synth_like import (
    WORKLOAD_SCHEMA,
    synth_like,
    workload_summary,
)
from tongyi_trace.run import RunDir
from tongyi_trace.trace.ingest import ingest_trace

runner = CliRunner()


def test_workload_summary_golden_on_tiny_fixture(tiny_bailian_path: Path, tmp_path: Path) -> None:
    ingest_trace(tiny_bailian_path, tmp_path)
    wl = workload_summary(RunDir(tmp_path).tables())
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
    tw = wl["twin"]
    assert sum(tw["rate_bins"]) == 6 and len(tw["input_tokens"]) == len(tw["quantile_levels"]) == 101
    assert (tw["input_tokens"][0], tw["input_tokens"][-1]) == (32, 96)
    # 6 requests: too few for length classes (at least 30 a class); 4 of them share a prefix
    assert tw["length_class_edges"] == [] and tw["by_length_class"][0]["hit_share"] == pytest.approx(4 / 6)


@pytest.fixture
def tiny_workload(tiny_bailian_path: Path, tmp_path: Path) -> dict[str, Any]:
    """The workload summary of the tiny fixture, as `kvtrace fit` writes it."""
    ingest_trace(tiny_bailian_path, tmp_path / "tiny")
    return workload_summary(RunDir(tmp_path / "tiny").tables())


def test_like_accepts_workload_run_folder_and_policy(tiny_bailian_path: Path, tiny_workload: dict[str, Any],
                                                     tmp_path: Path) -> None:
    (tmp_path / "workload.json").write_text(json.dumps(tiny_workload))
    (tmp_path / "policy.json").write_text(json.dumps({"schema": "kvtrace.policy/1", "workload": tiny_workload}))
    traces = [synth_like(src, 3, num_requests=300)[1]
              for src in (tmp_path / "workload.json", tmp_path / "policy.json", tmp_path / "tiny")]
    for tr in traces:
        assert np.array_equal(tr.hash_ids, traces[0].hash_ids)
    tr = traces[0]
    assert tr.num_requests == 300 and tr.arrival_ms.max() <= 30_000
    assert set(tr.type_names) == {"search", "text"} and np.all(tr.parent_chat_id == -1)
    # the fixture's inputs are 32-96 tokens: 2-6 blocks of 16
    assert set(np.diff(tr.offsets).tolist()) <= {2, 3, 4, 5, 6}


def test_like_is_deterministic_and_cli_runs(tiny_workload: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "workload.json"
    path.write_text(json.dumps(tiny_workload))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for out in (a, b):
        res = runner.invoke(app, ["synth", "--like", str(path), "--seed", "9", "--requests", "600", "-o",
                                  str(out), "--json"])
        assert res.exit_code == 0, res.output
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(res.stdout)["num_requests"] == 600
    res = runner.invoke(app, ["synth", "--like", str(path), "--profile", "to-c", "-o", str(a)])
    assert res.exit_code == 2 and "exactly one of" in res.output


def test_like_writes_the_runs_block_size(tiny_workload: dict[str, Any], tmp_path: Path) -> None:
    """512-token blocks: Mooncake JSONL (ingest reads 512); 16: Bailian; another size: a note to pass it."""
    path = tmp_path / "workload.json"
    for block_size, fmt in ((512, "mooncake"), (16, "bailian"), (64, "bailian")):
        path.write_text(json.dumps({**tiny_workload, "block_size": block_size}))
        out = tmp_path / f"t{block_size}.jsonl"
        res = runner.invoke(app, ["synth", "--like", str(path), "-o", str(out)])
        assert res.exit_code == 0 and ("--block-size 64" in res.output) == (block_size == 64), res.output
        prov = ingest_trace(out, tmp_path / f"run{block_size}", block_size=None if block_size != 64 else 64)
        assert (prov["format"], prov["block_size"]) == (fmt, block_size)
        assert prov["findings"].get("hash_len_mismatch", 0) == 0


def test_old_workload_file_is_refused_with_what_to_do(tiny_workload: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "workload.json"
    path.write_text(json.dumps({**tiny_workload, "schema": "kvtrace.workload/1"}))
    with pytest.raises(InputError, match=r"kvtrace.workload/1 summary .* has no twin model; give the run folder"):
        synth_like(path, 1)


@pytest.mark.parametrize("edit, field", [
    ({"num_requests": "5"}, "'num_requests' must be a number"),
    ({"duration_s": float("inf")}, "'duration_s' must be a finite number"),
    ({"num_requests": 5e20}, "'num_requests' must be an integer in [1, 2e+07]"),
    ({"block_size": 0}, "'block_size'"),
    ({"type_share": {}}, "'type_share'"),
    ({"twin": []}, "'twin' must be an object"),
    ({"twin": {"rate_bins": [1]}}, "'twin.quantile_levels' is missing"),
    ({"twin.quantile_levels": [0.5, 0.1]}, "'twin.quantile_levels'"),
    ({"twin.input_tokens": [3.0, 2.0]}, "'twin.input_tokens' must be 101 ascending quantiles"),
    ({"twin.rate_bins": [0, 0]}, "'twin.rate_bins'"),
    ({"twin.lru_hit": [0.1, 0.2]}, "'twin.lru_hit' must be 4 hit ratios"),
    ({"twin.length_class_edges": [5.0, 2.0]}, "'twin.length_class_edges' must be strictly ascending"),
    ({"twin.by_length_class": [{}]}, "'twin.by_length_class[0].shared_share' must be a list"),
    ({"twin.hit_share_by_time": [[2.0]]}, "'twin.hit_share_by_time[0][0]' must be a finite number in [0, 1]"),
    ({"twin.hit_share_by_time": "x"}, "'twin.hit_share_by_time' must be a list of time bins"),
    ({"twin.ideal_hit": "0.5"}, "'twin.ideal_hit' must be a number"),
    ({"twin.reuse_time_cdf": [0.5, 0.2]}, "'twin.reuse_time_cdf' must be 92 ascending shares"),
    ({"twin.reuse_time_cdf": [2.0]}, "'twin.reuse_time_cdf[0]' must be a finite number in [0, 1]"),
    ({"schema": "kvtrace.other/1"}, "'schema'"),
])
def test_bad_workload_files_are_one_line_errors(tiny_workload: dict[str, Any], tmp_path: Path,
                                                edit: dict[str, Any], field: str) -> None:
    path = tmp_path / "workload.json"
    doc = json.loads(json.dumps(tiny_workload))
    for key, value in edit.items():
        if key.startswith("twin."):
            doc["twin"][key[5:]] = value
        else:
            doc[key] = value
    path.write_text(json.dumps(doc))  # json.dumps writes inf as Infinity
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
