"""Replay across several servers (--server URL1,URL2 --router R) against stand-in endpoints
(tongyi_trace.replay.standin: real HTTP servers with an unlimited prefix cache each, NOT vLLM): the
routing, the records' instance, the per-instance reconciliation and the option errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from tongyi_trace.errors import UsageError
from tongyi_trace.replay.records import read_records
from tongyi_trace.replay.runner import ReplayOptions, reconcile_only, run_replay
from tongyi_trace.replay.schedule import ScheduleOptions
from tongyi_trace.replay.standin import StandInState

Standin = Callable[..., tuple[str, StandInState]]
FAST = ScheduleOptions(speedup=1000.0)


def _fleet(standin: Standin, n: int = 2, **kwargs: float) -> tuple[str, list[StandInState]]:
    started = [standin(block_size=32, **kwargs) for _ in range(n)]
    return ",".join(u for u, _ in started), [s for _, s in started]


# Hand-checked at 32-token engine blocks (the tiny fixture; A = trace blocks [1,2], B = [4,5]):
# prefix: req 0 goes to the least loaded (0); reqs 1, 2, 4, 5 start with A, indexed on 0; req 3 ([2,1])
#   matches nothing and goes to the instance with fewer requests (1). Hits as on one server.
# rr: 0,1,0,1,0,1; req 5 (A, B, ...) lands on 1, which holds A (from req 1) but not B: 32 instead of 64.
@pytest.mark.parametrize(("router", "instances", "cached"), [
    ("prefix", [0, 0, 0, 1, 0, 0], [0, 0, 32, 0, 64, 64]),
    ("rr", [0, 1, 0, 1, 0, 1], [0, 0, 32, 0, 64, 32]),
])
def test_requests_go_where_the_router_says_and_hits_match_the_fleet_simulator(
        fresh_tiny_run: Path, standin: Standin, router: str, instances: list[int], cached: list[int]) -> None:
    urls, states = _fleet(standin)
    res = run_replay(fresh_tiny_run, urls, ReplayOptions(name=router, max_in_flight=1, schedule=FAST,
                                                         router=router))
    recs = read_records(res.out_dir / "records.jsonl").sort("req_idx")
    assert recs["instance"].to_list() == instances
    assert recs["cached_tokens"].to_list() == cached
    for i, state in enumerate(states):  # each server saw exactly its requests
        assert sorted(state.completed) == [f"kvtrace-{r}" for r, k in enumerate(instances) if k == i]
    routing = pl.read_parquet(res.out_dir / "routing.parquet").sort("req_idx")
    assert routing["instance"].to_list() == instances
    assert routing["fleet_predicted_hit_tokens"].to_list() == cached
    s = res.summary
    assert s["servers"] == urls.split(",") and s["options"]["router"] == router
    assert s["fleet"]["routed_per_instance"] == [instances.count(0), instances.count(1)]
    rec = s["reconciliation"]
    assert (rec["exact_share"], rec["fleet_exact_share"], rec["num_off_route"]) == (1.0, 1.0, 0)
    assert rec["engine_hit_ratio"] == pytest.approx(sum(cached) / 360)
    per = rec["per_instance"]
    assert [p["num_routed"] for p in per] == [p["num_ok"] for p in per] == s["fleet"]["routed_per_instance"]
    assert all(p["engine_hit_ratio"] == p["predicted_hit_ratio"] == p["fleet_predicted_hit_ratio"] for p in per)
    # /metrics of both servers, summed: the same tokens as the records
    assert s["metrics"]["hit_ratio"] == pytest.approx(sum(cached) / 360)
    assert [m["server"] for m in s["metrics"]["per_server"]] == s["servers"]
    table = pl.read_parquet(res.out_dir / "reconcile.parquet")
    assert table.sort("req_idx")["instance"].to_list() == instances
    assert table["order"].to_list() == list(range(6))


def test_reconcile_only_rebuilds_the_per_instance_reconciliation(fresh_tiny_run: Path, standin: Standin) -> None:
    urls, _ = _fleet(standin)
    res = run_replay(fresh_tiny_run, urls, ReplayOptions(name="p", max_in_flight=1, schedule=FAST, router="prefix"))
    (res.out_dir / "reconcile.parquet").unlink()
    again = reconcile_only(fresh_tiny_run, "p")
    assert again.summary["reconciliation"] == json.loads(json.dumps(res.summary["reconciliation"]))
    assert (res.out_dir / "reconcile.parquet").is_file()


def test_one_server_is_todays_replay_with_instance_zero(fresh_tiny_run: Path, standin: Standin) -> None:
    url, _ = standin(block_size=32)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="one", max_in_flight=1, schedule=FAST))
    assert read_records(res.out_dir / "records.jsonl")["instance"].to_list() == [0] * 6
    assert "fleet" not in res.summary and "servers" not in res.summary
    assert not (res.out_dir / "routing.parquet").exists()


def test_option_mistakes_are_one_line_before_anything_starts(fresh_tiny_run: Path, standin: Standin) -> None:
    url, _ = standin(block_size=32)
    urls, _ = _fleet(standin)
    with pytest.raises(UsageError, match="choose how requests are routed with --router"):
        run_replay(fresh_tiny_run, urls, ReplayOptions(name="x"))
    with pytest.raises(UsageError, match="--router routes across several engines"):
        run_replay(fresh_tiny_run, url, ReplayOptions(name="x", router="prefix"))
    with pytest.raises(UsageError, match="twice"):
        run_replay(fresh_tiny_run, f"{url},{url}/", ReplayOptions(name="x", router="rr"))
    with pytest.raises(UsageError, match="unknown router 'nearest'"):
        run_replay(fresh_tiny_run, urls, ReplayOptions(name="x", router="nearest"))
    small, _ = standin(block_size=32, num_gpu_blocks=64)
    with pytest.raises(UsageError, match=r"the engines differ.*64 blocks"):
        run_replay(fresh_tiny_run, f"{url},{small}", ReplayOptions(name="x", router="prefix"))
    assert not (fresh_tiny_run / "replay" / "x").exists()


def test_the_cli_routes_over_several_servers_and_refuses_a_lone_router(fresh_tiny_run: Path,
                                                                       standin: Standin) -> None:
    from typer.testing import CliRunner

    from tongyi_trace.cli import app

    urls, _ = _fleet(standin)
    r = CliRunner().invoke(app, ["replay", str(fresh_tiny_run), "--server", urls, "--router", "rr", "--name", "c",
                                 "--speedup", "1000", "--max-in-flight", "1", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["fleet"]["router"] == "rr" and s["fleet"]["routed_per_instance"] == [3, 3]
    r = CliRunner().invoke(app, ["replay", str(fresh_tiny_run), "--server", urls, "--router", "rr", "--name", "c",
                                 "--speedup", "1000", "--max-in-flight", "1", "--overwrite"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in r.output.splitlines() if "http://" in line]
    second = json.loads((fresh_tiny_run / "replay" / "c" / "summary.json").read_text())
    per = second["reconciliation"]["per_instance"]  # the per-engine table shows the summary's figures
    assert [row[:4] for row in rows] == [[str(i), p["server"], "3", "3"] for i, p in enumerate(per)], r.output
    assert [row[4] for row in rows] == [f"{100 * p['engine_hit_ratio']:.2f}%" for p in per], r.output
    r = CliRunner().invoke(app, ["replay", str(fresh_tiny_run), "--server", urls.split(",")[0], "--router", "rr"])
    assert r.exit_code == 2 and "--router routes across several engines" in r.output
    assert len(r.output.strip().splitlines()) == 1
