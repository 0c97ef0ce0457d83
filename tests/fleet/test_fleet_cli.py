"""`kvtrace simulate --instances --router` end to end on a synthetic multi-turn run (real CLI, real
artifacts): one instance reproduces `kvtrace simulate` row for row, the sweep writes sim/fleet/."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from tongyi_trace.cli import app
from tongyi_trace.policy.file import CategoryParams, PolicyParams, save_policy

POLICIES = "lru,fifo,lfu,s3fifo,gdsf,wa,oracle"


@pytest.fixture(scope="module")
def toc_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fleet")
    trace, run = d / "toc.jsonl", d / "toc.run"
    for args in (["synth", "--profile", "to-c", "--seed", "3", "--scale", "0.01", "-o", str(trace)],
                 ["ingest", str(trace), "-o", str(run), "-q"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
    save_policy(PolicyParams(categories={"text": CategoryParams(0.9, 0.01, 600.0, 600.0)},
                             default=CategoryParams(0.3, 0.001, 600.0, 600.0)), d / "policy.json")
    return run


def _json(args: list[str]) -> dict:
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.mark.parametrize("hbm", [[], ["--hbm-capacity", "1%"]])
def test_one_instance_equals_simulate(toc_run: Path, hbm: list[str]) -> None:
    common = ["simulate", str(toc_run), "-p", POLICIES, "-c", "2%,10%", "--params",
              str(toc_run.parent / "policy.json"), *hbm, "--json", "-j", "2"]
    single = {(r["policy"], r["capacity"]): r for r in _json(common)["rows"]}
    fleet = _json([*common, "--instances", "1", "--router", "rr"])
    assert len(fleet["rows"]) == len(single) == 14
    # with two tiers the fleet's hits are the two-tier cache's, which simulate reports beside its single
    # cache's hit_ratio (tiered_hit_ratio, the tiers' ratios, and the QTTFT from the two-tier hits)
    keys = ["qttft_mean_s", "qttft_p50_s", "qttft_p99_s", *(["hbm_hit_ratio", "dram_hit_ratio"] if hbm else
                                                            ["num_hits", "hit_ratio", "num_hit_tokens"])]
    for row in fleet["rows"]:
        ref = single[(row["policy"], row["capacity"])]
        assert {k: row[k] for k in keys} == {k: ref[k] for k in keys}, row["policy"]
        if hbm:
            assert row["hit_ratio"] == pytest.approx(ref["tiered_hit_ratio"]) and row["dram_hit_ratio"] > 0
    assert fleet["summary"]["session_source"] == "requests.session_id"


def test_fleet_sweep_artifacts_and_routing(toc_run: Path) -> None:
    doc = _json(["simulate", str(toc_run), "-p", "lru", "-c", "5%", "--instances", "2,4", "--router", "all",
                 "--json", "-j", "2"])
    rows = {(r["router"], r["num_instances"]): r for r in doc["rows"]}
    assert len(rows) == 12
    for n in (2, 4):
        assert sum(rows[("rr", n)]["requests_per_instance"]) == doc["summary"]["num_requests"]
        assert rows[("session", n)]["hit_ratio"] > rows[("rr", n)]["hit_ratio"]
        assert rows[("prefix", n)]["hit_ratio"] > rows[("rr", n)]["hit_ratio"]
        assert rows[("rr", n)]["duplication"] > rows[("prefix", n)]["duplication"]
    out = toc_run / "sim" / "fleet"
    assert len((out / "results.jsonl").read_text().splitlines()) == 12
    table = pl.read_parquet(out / "results.parquet")
    assert table.height == 12 and {"hit_ratio", "qttft_p99_s", "imbalance", "duplication"} <= set(table.columns)
    assert json.loads((out / "summary.json").read_text())["schema"] == "kvtrace.fleet/1"


def test_fleet_options_errors_are_one_line(toc_run: Path) -> None:
    for args, msg in [(["--router", "rr"], "give --instances too"), (["--instances", "0"], "out of range"),
                      (["--instances", "2", "--router", "belady"], "unknown router"),
                      (["--instances", "two"], "not a whole number")]:
        res = CliRunner().invoke(app, ["simulate", str(toc_run), "-p", "lru", "-c", "5%", *args])
        assert res.exit_code == 2, (args, res.output)
        assert msg in res.output and "Traceback" not in res.output


def test_report_section_reads_the_sweep(toc_run: Path) -> None:
    from tongyi_trace.report.sections import fleet
    from tongyi_trace.run import open_run

    _json(["simulate", str(toc_run), "-p", "lru", "-c", "5%", "--instances", "1,2", "--router", "rr,prefix",
           "--json", "-j", "1"])
    [s] = fleet.build(open_run(toc_run))
    assert s.tables["grid"].columns == ["router", "capacity", "1 inst: hit / P99", "2 inst: hit / P99"]
    assert [row[0] for row in s.tables["grid"].rows] == ["rr", "prefix"]
    rows = pl.read_parquet(toc_run / "sim" / "fleet" / "results.parquet")
    best = rows.sort(["qttft_p99_s", "hit_ratio"], descending=[False, True]).row(0, named=True)
    assert (s.values["best_router"], s.values["best_instances"]) == (best["router"], best["num_instances"])
    assert s.values["partial"] is False and set(s.figures) == {"hit", "p99"}
