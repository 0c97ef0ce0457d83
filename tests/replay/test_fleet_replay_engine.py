"""Replay across two REAL CPU vLLM engines (the session fixture `cpu_engine`, tests/conftest.py, and a second
one started here alike), one request at a time, `prefix` router: every request's engine hit must be what
the fleet simulator predicted for it before the replay (replay/fleet.py). If vLLM behaves differently, fix
tongyi_trace/sim/engine_model.py, not this test."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.replay.conftest import KVTRACE, kvtrace_cli

pytestmark = [pytest.mark.engine, pytest.mark.full]  # own engine boots: make test-all only (tests/lanes.py)

NUM_REQUESTS = 160




@pytest.fixture(scope="module")
def second_engine(cpu_engine: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A second CPU engine with the first one's cache shape; stopped at the end of the module."""
    name = f"pytest-b-{os.getpid()}"
    out = kvtrace_cli("engine", "start", "--name", name, "--json", "--num-blocks", str(cpu_engine["num_blocks"]),
                   "--block-size", str(cpu_engine["block_size"]), "--max-model-len", str(cpu_engine["max_model_len"]))
    try:
        yield json.loads(out)
    finally:
        subprocess.run([*KVTRACE, "engine", "stop", "--name", name, "--quiet"], check=False)


@pytest.fixture(scope="module")
def fleet_replay(cpu_engine: dict[str, Any], second_engine: dict[str, Any],
                 tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """A to-C synthetic trace replayed on both engines (emptied first) with the prefix router."""
    d = tmp_path_factory.mktemp("fleet_engine")
    kvtrace_cli("synth", "--profile", "to-c", "--seed", "2", "--requests", "300", "--duration", "600",
             "-o", str(d / "toc.jsonl"), "--quiet")
    kvtrace_cli("ingest", str(d / "toc.jsonl"), "-o", str(d / "run"), "--quiet")
    out = kvtrace_cli("replay", str(d / "run"), "--server", f"{cpu_engine['url']},{second_engine['url']}",
                   "--router", "prefix", "--name", "fleet", "--max-in-flight", "1", "--speedup", "1000",
                   "--max-output", "4", "--max-requests", str(NUM_REQUESTS), "--reset-cache", "--json")
    return json.loads(out), d / "run" / "replay" / "fleet"


def test_both_engines_serve_and_hits_equal_the_fleet_simulators_prediction(
        fleet_replay: tuple[dict[str, Any], Path]) -> None:
    s, out = fleet_replay
    assert s["status"] == "complete" and s["counts"]["num_ok"] == NUM_REQUESTS
    routed = s["fleet"]["routed_per_instance"]
    assert len(routed) == 2 and min(routed) > 0 and sum(routed) == NUM_REQUESTS
    rec = s["reconciliation"]
    assert rec is not None, s["reconciliation_note"]
    assert rec["num_off_route"] == 0
    table = pl.read_parquet(out / "reconcile.parquet")
    off = table.filter(pl.col("engine_cached_tokens") != pl.col("fleet_predicted_hit_tokens"))
    assert off.height == 0, off.head(5).to_dicts()
    assert rec["fleet_exact_share"] == 1.0
    # the caches are small enough that LRU loses hits against the unlimited ideal: evictions happened
    assert rec["predicted_hit_ratio"] < rec["ideal_hit_ratio"] - 0.02
    for p in rec["per_instance"]:
        assert p["num_ok"] == p["num_routed"] and p["engine_hit_ratio"] == p["fleet_predicted_hit_ratio"]
    # each engine's /metrics saw exactly the tokens its records report
    for m, p in zip(s["metrics"]["per_server"], rec["per_instance"], strict=True):
        assert m["server"] == p["server"] and m["query_tokens"] == p["prompt_tokens"]
        assert m["hit_tokens"] == pytest.approx(p["engine_hit_ratio"] * p["prompt_tokens"])
