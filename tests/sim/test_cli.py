"""`kvtrace simulate` end to end on a hand-made run folder (real CLI, real artifacts)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from tongyi_trace.cli import app
from tongyi_trace.policy.file import CategoryParams, PolicyParams, save_policy

REQS = [[1, 2], [3], [1, 2], [4], [3]]  # test_golden.FIXTURE_A


def test_simulate_json_and_artifacts(make_run: Callable[..., Path]) -> None:
    run = make_run(REQS)
    res = CliRunner().invoke(app, ["simulate", str(run), "-p", "lru,fifo,oracle", "-c", "3,inf", "--json",
                                   "-j", "1"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    got = {(r["policy"], r["capacity"]): r["num_hits"] for r in doc["rows"]}
    assert got == {("lru", "3"): 2, ("lru", "inf"): 3, ("fifo", "3"): 3, ("fifo", "inf"): 3,
                   ("oracle", "3"): 3, ("oracle", "inf"): 3}
    assert doc["summary"]["ideal_hit_ratio"] == 3 / 7
    sim = run / "sim"
    assert len((sim / "results.jsonl").read_text().splitlines()) == 6
    table = pl.read_parquet(sim / "results.parquet")
    assert table.height == 6 and {"hit_ratio", "qttft_p99_s", "evict_decision_ns"} <= set(table.columns)
    curve = pl.read_parquet(sim / "lru_curve.parquet")
    assert curve["capacity_blocks"].to_list() == [0, 2, 3, 4]  # rises where a stack distance lands
    assert pl.read_parquet(sim / "per_category.parquet")["category"].unique().to_list() == ["all"]


def _wa_run(make_run: Callable[..., Path], tmp_path: Path) -> tuple[Path, Path]:
    """REQS in two categories, and a policy file for them."""
    run = make_run(REQS, categories=["a", "b", "a", "b", "a"])
    policy = tmp_path / "policy.json"
    save_policy(PolicyParams(categories={"a": CategoryParams(0.9, 1.0, 1.0, 10.0)},
                             default=CategoryParams(0.1, 0.1, 10.0, 10.0)), policy)
    return run, policy


def test_simulate_parallel_sweep_and_wa_ablation(make_run: Callable[..., Path], tmp_path: Path) -> None:
    run, policy = _wa_run(make_run, tmp_path)
    res = CliRunner().invoke(app, ["simulate", str(run), "-p", "lru,wa", "-c", "2,3", "--params", str(policy),
                                   "--ablation", "--json", "-j", "2"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert [(r["policy"], r["capacity"]) for r in rows] == [
        (p, c) for p in ("lru", "wa", "wa-no-life", "wa-conditional", "wa-no-offset", "wa-no-guard")
        for c in ("2", "3")]
    assert {r["params"]["use_life"] for r in rows if r["policy"] == "wa-no-life"} == {False}


def test_simulate_km_model_without_life_window(make_run: Callable[..., Path], tmp_path: Path) -> None:
    """The km model with the unbounded window (wa-no-life: F(inf) - F(t)) runs like the others."""
    run, policy = _wa_run(make_run, tmp_path)
    res = CliRunner().invoke(app, ["simulate", str(run), "-p", "wa-no-life", "-c", "2,3", "--params", str(policy),
                                   "--set", "wa.model=km", "--set", "wa.conditional=true", "--json", "-j", "1"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert [(r["params"]["model"], r["params"]["use_life"], r["num_refs"]) for r in rows] == [("km", False, 7)] * 2
    assert all(0 <= r["num_hits"] <= 3 for r in rows)  # 3: the ideal (test_simulate_json_and_artifacts)


def test_simulate_errors_are_one_line(make_run: Callable[..., Path], tmp_path: Path) -> None:
    run = make_run(REQS)
    cases = [
        (["simulate", str(run), "-p", "wa"], "needs fitted parameters"),
        (["simulate", str(run), "-c", "12q"], "is not a number of blocks"),
        (["simulate", str(run), "-p", "lru", "--set", "lru.depth=3"], "unknown parameter"),
        (["simulate", str(run), "-p", "belady"], "unknown policy"),
        (["simulate", str(tmp_path / "nope")], "not a kvtrace run folder"),
        (["simulate", str(run), "--engine-block-size", "24"], "multiple or a divisor"),
    ]
    for args, msg in cases:
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert msg in res.output and "Traceback" not in res.output


def test_list_policies_prints_parameters() -> None:
    res = CliRunner().invoke(app, ["simulate", "--list-policies", "--json"])
    assert res.exit_code == 0
    doc = {p["policy"]: p for p in json.loads(res.stdout)["policies"]}
    assert set(doc) >= {"lru", "fifo", "lfu", "s3fifo", "gdsf", "wa", "oracle"}
    assert {p["name"]: p["default"] for p in doc["s3fifo"]["parameters"]} == {
        "small_ratio": 0.1, "ghost_ratio": 0.9, "move_to_main_threshold": 1, "freq_cap": 3, "leaf_only": False}
    assert {p["name"]: p["default"] for p in doc["wa"]["parameters"]}["leaf_only"] is True


def test_hbm_split_and_cost_overrides(make_run: Callable[..., Path]) -> None:
    # LRU with 2 blocks on REQS: r2 hits only block 1 (block 2 was evicted by r1's 3... see test_golden):
    # 1 hit of 7. With --hbm-capacity 2 and capacity 3, r2's second block (16 tokens) is loaded from CPU.
    run = make_run(REQS, times_s=[0.0, 100.0, 200.0, 300.0, 400.0])
    res = CliRunner().invoke(app, ["simulate", str(run), "-p", "lru", "-c", "3", "--hbm-capacity", "2",
                                   "--prefill-overhead-s", "1", "--prefill-s-per-token", "0.01",
                                   "--load-s-per-token", "0.001", "--json", "-j", "1"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)["rows"]
    assert row["hbm_hit_ratio"] == 1 / 7
    # QTTFT (no queueing, arrivals 100 s apart): 1 + 0.01 x uncached tokens + 0.001 x loaded tokens
    # r0 32 uncached, r1 16, r2 0 (+16 loaded), r3 16, r4 16 -> 1.32, 1.16, 1.016, 1.16, 1.16
    assert row["qttft_mean_s"] == pytest.approx((1.32 + 1.16 + 1.016 + 1.16 + 1.16) / 5)


def test_a_policy_fitted_on_another_trace_is_flagged(make_run: Callable[..., Path], tmp_path: Path) -> None:
    run = make_run(REQS, categories=["a", "b", "a", "b", "a"])
    policy = tmp_path / "policy.json"
    save_policy(PolicyParams(categories={"text-1": CategoryParams(0.9, 1.0, 1.0, 10.0)},
                             default=CategoryParams(0.1, 0.1, 10.0, 10.0), trace={"run_id": "elsewhere"}), policy)
    res = CliRunner().invoke(app, ["simulate", str(run), "-p", "wa", "-c", "2", "--params", str(policy), "--json",
                                   "-j", "1"])
    assert res.exit_code == 0, res.output
    [warning] = json.loads(res.stdout)["summary"]["warnings"]
    assert warning.startswith("none of this run's 2 categories is in the policy file") and "another trace" in warning


def test_hbm_policy(make_run: Callable[..., Path]) -> None:
    """--hbm-policy lru: HBM (2 blocks) runs LRU, DRAM (1 block) runs -p fifo, exactly (sim/simulate.py):
    r1 [3] demotes 2; r2 [1,2] hits 1 in HBM and 2 in DRAM (3 demoted); r3 [4] demotes 2, FIFO dropping 3;
    r4 [3] misses. One FIFO cache of 3 blocks hits 3 of 7. Refused without --hbm-capacity or for a policy
    that needs a fit."""
    run = make_run(REQS, times_s=[0.0, 100.0, 200.0, 300.0, 400.0])
    res = CliRunner().invoke(app, ["simulate", str(run), "-p", "fifo", "-c", "3", "--hbm-capacity", "2",
                                   "--hbm-policy", "lru", "--json", "-j", "1"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)["rows"]
    assert row["policy"] == "fifo" and row["hbm_policy"] == "lru" and row["hbm_hit_ratio"] == 1 / 7
    assert (row["dram_hit_ratio"], row["tiered_hit_ratio"], row["hit_ratio"]) == (1 / 7, 2 / 7, 3 / 7)
    for args, message in ((["--hbm-policy", "lru"], "--hbm-policy needs --hbm-capacity"),
                          (["--hbm-capacity", "2", "--hbm-policy", "wa"], "--hbm-policy wa: give one of")):
        res = CliRunner().invoke(app, ["simulate", str(run), "-p", "fifo", "-c", "3", *args])
        assert res.exit_code == 2 and message in res.output and len(res.output.strip().splitlines()) == 1, res.output


def test_simulate_intervals_and_no_intervals(make_run: Callable[..., Path]) -> None:
    """Every row's gain over LRU carries its interval (LRU's own: exactly 0), the summary says how they were
    made; --no-intervals leaves them out."""
    run = make_run(REQS * 8)
    res = CliRunner().invoke(app, ["simulate", str(run), "-p", "lru,fifo", "-c", "3", "--json", "-j", "1"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    lru, fifo = doc["rows"]
    assert (lru["gain_vs_lru_pp"], lru["gain_vs_lru_lo_pp"], lru["gain_vs_lru_hi_pp"]) == (0.0, 0.0, 0.0)
    assert fifo["gain_vs_lru_pp"] == pytest.approx(100 * (fifo["hit_ratio"] - lru["hit_ratio"]))
    assert fifo["gain_vs_lru_lo_pp"] <= fifo["gain_vs_lru_pp"] <= fifo["gain_vs_lru_hi_pp"]
    iv = doc["summary"]["intervals"]
    assert iv["resampled"] == "time slices" and iv["num_groups"] == 40 and iv["confidence"] == 0.95
    assert [t["target"] for t in iv["targets"]] == [0.8, 0.9, 0.95]
    assert doc["recommendation"]["capacities"][0]["run_policy"] in ("lru", "fifo")
    off = CliRunner().invoke(app, ["simulate", str(run), "-p", "lru,fifo", "-c", "3", "--json", "-j", "1",
                                   "--no-intervals"])
    doc = json.loads(off.stdout)
    assert doc["summary"]["intervals"] is None and "gain_vs_lru_pp" not in doc["rows"][1]
    assert doc["recommendation"]["capacities"][0]["run_policy"] is None


def test_a_policy_of_another_block_size_and_fitted_without_choices_are_flagged(make_run: Callable[..., Path],
                                                                               tmp_path: Path) -> None:
    """Issue 42: a policy fitted at 64-token blocks on a 16-token run, and `-p fitted` with a file that has no
    choice per capacity (it silently ran the file's WA), each give a warning."""
    run = make_run(REQS, categories=["a", "b", "a", "b", "a"])
    prov = json.loads((run / "provenance.json").read_text())
    policy = tmp_path / "policy.json"
    save_policy(PolicyParams(categories={"a": CategoryParams(0.9, 1.0, 1.0, 10.0)},
                             default=CategoryParams(0.1, 0.1, 10.0, 10.0),
                             trace={"run_id": prov.get("run_id"), "block_size": 4 * prov["block_size"]}), policy)
    res = CliRunner().invoke(app, ["simulate", str(run), "-p", "fitted", "-c", "2", "--params", str(policy),
                                   "--json", "-j", "1"])
    assert res.exit_code == 0, res.output
    size, fitted = json.loads(res.stdout)["summary"]["warnings"]
    assert size.startswith(f"the policy file was fitted at {4 * prov['block_size']}-token blocks, this run has "
                           f"{prov['block_size']}-token blocks")
    assert fitted.startswith("-p fitted: the policy file has no choice per capacity")
