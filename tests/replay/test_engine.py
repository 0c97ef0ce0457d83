"""Replay against the REAL CPU vLLM engine (session fixture `cpu_engine`, tests/conftest.py): the engine's
hits must be what the simulator's LRU model of vLLM predicts. If this fails because vLLM behaves
differently, fix tongyi_trace/sim/engine_model.py, not this test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.replay.conftest import kvtrace_cli

pytestmark = pytest.mark.engine

NUM_REQUESTS = 240




@pytest.fixture(scope="module")
def toc_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A to-C synthetic trace (kvtrace synth), 400 requests over 10 minutes, ingested."""
    d = tmp_path_factory.mktemp("engine_toc")
    kvtrace_cli("synth", "--profile", "to-c", "--seed", "1", "--requests", "400", "--duration", "600",
             "-o", str(d / "toc.jsonl"), "--quiet")
    kvtrace_cli("ingest", str(d / "toc.jsonl"), "-o", str(d / "run"), "--quiet")
    return d / "run"


@pytest.fixture(scope="module")
def lru_replay(cpu_engine: dict[str, Any], toc_run: Path) -> dict[str, Any]:
    """One replay, one request at a time, on an emptied cache; returns summary.json."""
    out = kvtrace_cli("replay", str(toc_run), "--server", cpu_engine["url"], "--name", "lru", "--max-in-flight",
                   "1", "--speedup", "1000", "--max-output", "4", "--max-requests", str(NUM_REQUESTS),
                   "--reset-cache", "--json")
    summary: dict[str, Any] = json.loads(out)
    return summary


def test_engine_status_reports_the_running_engine(cpu_engine: dict[str, Any]) -> None:
    st = json.loads(kvtrace_cli("engine", "status", "--name", cpu_engine["name"], "--json"))
    assert st["running"] and st["healthy"] and st["installed"]
    assert st["state"]["pid"] == cpu_engine["pid"] and st["state"]["url"] == cpu_engine["url"]


def test_replay_completes_and_reads_the_engine_config(lru_replay: dict[str, Any],
                                                      cpu_engine: dict[str, Any]) -> None:
    s = lru_replay
    assert s["status"] == "complete"
    assert s["counts"]["num_error"] == 0 and s["counts"]["num_ok"] == NUM_REQUESTS
    assert (s["engine"]["block_size"], s["engine"]["num_gpu_blocks"]) == (cpu_engine["block_size"],
                                                                         cpu_engine["num_blocks"])
    assert s["engine"]["max_model_len"] == cpu_engine["max_model_len"]
    # /metrics deltas and the per-request cached_tokens describe the same tokens (nothing else ran)
    assert s["metrics"]["query_tokens"] == s["prompt_tokens_ok"]
    assert s["metrics"]["hit_ratio"] == pytest.approx(s["records_hit_ratio"], abs=1e-12)


def test_engine_hits_match_the_simulators_lru_prediction(lru_replay: dict[str, Any]) -> None:
    rec = lru_replay["reconciliation"]
    assert rec is not None, lru_replay["reconciliation_note"]
    # the cache is small enough that LRU loses hits against the unlimited ideal: evictions happened
    assert rec["predicted_hit_ratio"] < rec["ideal_hit_ratio"] - 0.02
    # one request at a time on an emptied cache: the engine's hits equal the prediction request for request
    assert rec["exact_share"] == 1.0 and rec["worst"] == [], rec["worst"][:5]
    assert lru_replay["metrics"]["hit_ratio"] == pytest.approx(rec["predicted_hit_ratio"], abs=1e-12)


def test_install_is_a_fast_no_op_once_installed(cpu_engine: dict[str, Any]) -> None:
    from typer.testing import CliRunner

    from tongyi_trace.cli import app

    r = CliRunner().invoke(app, ["engine", "install", "--json"])
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["already_installed"] is True and info["vllm"] == "0.32.0"
