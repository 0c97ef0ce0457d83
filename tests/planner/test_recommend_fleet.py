"""The Recommendation names the fleet: the router x instance count with the lowest P99 QTTFT that keeps every
instance below utilization 1 when a fleet sweep was run, else the instances the saturation check suggests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tongyi_trace.sim.recommend import describe, max_utilization, recommend, recommend_fleet

SUMMARY = {"ideal_hit_ratio": 0.6, "block_size": 16, "model": "qwen2-7b"}
CURVE = {"capacity_blocks": np.array([0, 100]), "hit_ratio": np.array([0.0, 0.5])}
SINGLE = [{"policy": "lru", "capacity": "100", "capacity_blocks": 100, "hit_ratio": 0.5, "qttft_mean_s": 40.0,
           "utilization": 2.6, "saturated": True, "instances_needed": 3},
          {"policy": "lru", "capacity": "50", "capacity_blocks": 50, "hit_ratio": 0.3, "qttft_mean_s": 90.0,
           "utilization": 3.4, "saturated": True, "instances_needed": 4}]


def _fleet(router: str, n: int, p99: float, hit: float, util: list[float], policy: str = "lru") -> dict[str, object]:
    return {"router": router, "num_instances": n, "policy": policy, "capacity": "100", "capacity_blocks": 100,
            "hit_ratio": hit, "qttft_mean_s": p99 / 3, "qttft_p99_s": p99, "utilization": util}


FLEET = [
    _fleet("rr", 2, 900.0, 0.30, [1.3, 1.3]),             # saturated
    _fleet("prefix", 2, 400.0, 0.55, [0.95, 0.97]),        # keeps up, 2 instances
    _fleet("prefix", 4, 1.2, 0.55, [0.40, 0.52, 0.47, 0.81]),  # keeps up, lowest P99
    _fleet("least-loaded", 4, 1.2, 0.41, [0.6, 0.6, 0.6, 0.6]),  # same P99, lower hit ratio
    _fleet("oracle-affinity", 4, 0.5, 0.58, [0.5] * 4),   # not a router one can run
    _fleet("prefix", 4, 0.4, 0.59, [0.5] * 4, policy="oracle"),  # not a deployable policy
]


def test_best_fleet_configuration_golden() -> None:
    f = recommend_fleet(FLEET)
    assert f["num_configurations"] == 4 and f["max_instances"] == 4
    best, fewest = f["best"], f["fewest_instances"]
    assert (best["router"], best["num_instances"], best["hit_ratio"], best["qttft_p99_s"]) == ("prefix", 4, 0.55, 1.2)
    assert best["max_utilization"] == pytest.approx(0.81)  # the busiest instance
    assert (fewest["router"], fewest["num_instances"], fewest["max_utilization"]) == ("prefix", 2, 0.97)
    assert f["least_utilized"] is None
    line = next(ln for ln in describe(recommend(SINGLE, CURVE, SUMMARY, fleet_rows=FLEET)) if ln.startswith("Fleet"))
    # the gain over round-robin where the sweep has rr at the same instances (2: 0.55 - 0.30), none at 4
    assert fewest["gain_vs_rr_pp"] == pytest.approx(25.0) and best["gain_vs_rr_pp"] is None
    assert line == ("Fleet: best configuration that keeps utilization below 1: router prefix, 4 instances, lru at "
                    "100 per instance: hit 0.5500, P99 QTTFT 1.20 s, busiest instance's utilization 0.81; fewest "
                    "instances: router prefix, 2 instances, lru at 100 per instance: hit 0.5500 (+25.00 points over "
                    "round-robin), P99 QTTFT 400.00 s, busiest instance's utilization 0.97.")


def test_no_fleet_configuration_keeps_up() -> None:
    f = recommend_fleet(FLEET[:1])
    assert f["best"] is None and f["least_utilized"]["router"] == "rr"
    line = next(ln for ln in describe(recommend(SINGLE, CURVE, SUMMARY, fleet_rows=FLEET[:1]))
                if ln.startswith("Fleet"))
    assert line.startswith("Fleet: none of the 1 fleet configurations keeps utilization below 1; the least loaded: "
                           "router rr, 2 instances") and line.endswith("simulate more than 2 instances.")


def test_without_a_fleet_sweep_the_saturation_check_sizes_it() -> None:
    rec = recommend(SINGLE, CURVE, SUMMARY)
    assert rec["fleet"] is None and rec["instances_suggested"] == 4  # the most any simulated capacity needs
    line = next(ln for ln in describe(rec) if ln.startswith("Fleet"))
    assert "the saturation check suggests 4 instances" in line and "--instances 1,4,8" in line


def test_utilization_as_stored_in_parquet() -> None:
    assert max_utilization({"utilization": json.dumps([0.2, 0.7, 0.4])}) == 0.7
    assert max_utilization({"utilization": 0.3}) == 0.3 and max_utilization({}) is None


def test_report_and_simulate_name_the_fleet(tmp_path: Path) -> None:
    """A real run: the single-instance sweep saturates (arrivals 50x faster); the fleet sweep's best
    configuration is named with the values of its row in RUN/sim/fleet/results.parquet."""
    from tongyi_trace.fleet.sweep import FleetOptions, fleet_simulate_run
    from tongyi_trace.report.render import build_sections
    from tongyi_trace.run import open_run
    from tongyi_trace.sim.recommend import recommend_sim_dir
    from tongyi_trace.sim.sweep import SimulateOptions, simulate_run
    from tongyi_trace.trace.ingest import ingest_trace

    trace = tmp_path / "t.jsonl"
    rng = np.random.default_rng(3)
    with trace.open("w") as f:
        for i in range(600):
            user = int(rng.integers(0, 30))
            prefix = [user * 100 + k for k in range(int(rng.integers(1, 6)))]
            f.write(json.dumps({"chat_id": i, "parent_chat_id": -1, "timestamp": i * 0.5, "input_length": 16 * 8,
                                "output_length": 8, "type": "text", "turn": 1, "user_id": f"u{user}",
                                "hash_ids": prefix + [10_000 + i * 10 + k for k in range(8 - len(prefix))]}) + "\n")
    run_dir = tmp_path / "run"
    ingest_trace(trace, run_dir)
    opts = SimulateOptions(policies="lru", capacities="40,200", jobs=1, arrival_scale=0.02)
    simulate_run(run_dir, opts)
    before = recommend_sim_dir(run_dir / "sim")
    assert before is not None and before["fleet"] is None
    single = pl.read_parquet(run_dir / "sim" / "results.parquet")
    assert single["saturated"].all()
    assert before["instances_suggested"] == single["instances_needed"].max() > 1

    fleet_simulate_run(run_dir, opts, FleetOptions("1,2,8,16", "rr,prefix"))
    rec = recommend_sim_dir(run_dir / "sim")
    assert rec is not None and rec["fleet"] is not None
    best = rec["fleet"]["best"]
    rows = pl.read_parquet(run_dir / "sim" / "fleet" / "results.parquet").to_dicts()
    keeps_up = [r for r in rows if max(json.loads(r["utilization"])) < 1]
    assert keeps_up and all(r["num_instances"] > 1 for r in keeps_up)  # one instance never keeps up here
    lowest = min(r["qttft_p99_s"] for r in keeps_up)
    row = next(r for r in keeps_up if (r["router"], r["num_instances"], r["capacity"])
               == (best["router"], best["num_instances"], best["capacity"]))
    assert best["qttft_p99_s"] == row["qttft_p99_s"] == lowest and best["hit_ratio"] == row["hit_ratio"]
    assert best["max_utilization"] == max(json.loads(row["utilization"])) < 1
    fewest = rec["fleet"]["fewest_instances"]
    assert fewest["num_instances"] == min(r["num_instances"] for r in keeps_up)

    section = build_sections(open_run(run_dir))[0]
    assert section.key == "recommendation"
    fleet_line = next(ln for ln in section.values["lines"] if ln.startswith("Fleet"))
    assert f"router {best['router']}, {best['num_instances']} instances, lru at {best['capacity']} per instance: " \
           f"hit {best['hit_ratio']:.4f}" in fleet_line
    assert any(h.label.startswith("fleet with the lowest P99") and f"{best['router']} x {best['num_instances']}"
               in h.value for h in section.headline)


def test_fleet_command_prints_its_recommendation(mooncake_synthetic_path: Path, tmp_path: Path) -> None:
    """`simulate --instances 2,4 --router all` off a terminal: progress lines on stderr while it runs, then the
    Recommendation (router, instances, gain over round-robin, utilization) and a utilization column; with LRU
    instances `prefix` equals `oracle-affinity` (its index of routed prompts is the LRU caches) and says why."""
    from typer.testing import CliRunner

    from tongyi_trace.cli import app
    from tongyi_trace.trace.ingest import ingest_trace

    run_dir = tmp_path / "run"
    ingest_trace(mooncake_synthetic_path, run_dir)
    res = CliRunner().invoke(app, ["simulate", str(run_dir), "--instances", "2,4", "--router", "all", "-p", "lru",
                                   "-c", "2000", "-j", "1"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert out.startswith("Recommendation\n  Fleet: best configuration that keeps utilization below 1: router ")
    assert "points over round-robin" in out and "busiest instance's utilization" in out
    assert "prefix = oracle-affinity here: with LRU instances" in out
    header = next(line for line in out.splitlines() if line.startswith("┃ router"))
    assert "max util" in header
    rows = pl.read_parquet(run_dir / "sim" / "fleet" / "results.parquet").to_dicts()
    by = {(r["router"], r["num_instances"]): r for r in rows}
    for n in (2, 4):  # the same caches, so the same decisions
        assert by[("prefix", n)]["hit_ratio"] == by[("oracle-affinity", n)]["hit_ratio"]
    assert "fleet " in res.stderr and "/12 (" in res.stderr  # 'fleet ... 12/12 (N s)': progress off a terminal
    assert len([r for r in rows if "error" not in r]) == 12
