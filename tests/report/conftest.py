"""Fixtures of the report tests: a tiny trace whose strings are hostile, run through the real pipeline
(ingest, analyze, fit, two replays against the stand-in endpoint, compare), and a run with nothing but
the ingest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tongyi_trace.analysis import run_analyses
from tongyi_trace.fit.policy_fit import fit_policy
from tongyi_trace.replay.compare import compare_replays
from tongyi_trace.replay.runner import ReplayOptions, run_replay
from tongyi_trace.replay.schedule import ScheduleOptions
from tongyi_trace.replay.standin import StandInState, serve
from tongyi_trace.run import RunDir, open_run
from tongyi_trace.sim.sweep import SimulateOptions, simulate_run
from tongyi_trace.trace.ingest import ingest_trace

EVIL = "<script>alert(1)</script>"
EVIL_USER = "</script><img src=x onerror=alert(2)>"


@pytest.fixture(scope="session")
def evil_trace(tiny_bailian_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_bailian.jsonl with the type 'search' renamed to EVIL and one user id set to EVIL_USER."""
    out = tmp_path_factory.mktemp("evil_trace") / "evil.jsonl"
    lines = []
    for line in tiny_bailian_path.read_text().splitlines():
        rec = json.loads(line)
        if rec["type"] == "search":
            rec["type"] = EVIL
        if rec.get("user_id") == "u2":
            rec["user_id"] = EVIL_USER
        lines.append(json.dumps(rec))
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.fixture(scope="session")
def evil_run(evil_trace: Path, tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    """The EVIL trace with every artifact the report reads: analyses, fit (train/test), a simulator sweep
    (every policy and the WA ablation), two replays against the stand-in endpoint (with failed
    requests) and their comparison."""
    out = tmp_path_factory.mktemp("evil_run")
    ingest_trace(evil_trace, out)
    run = open_run(out)
    run_analyses(run)
    fit_policy(out, out / "fit" / "policy.json", train="0:15", test="15:", min_samples=2, holdout=0.0)
    simulate_run(out, SimulateOptions(policies="all", capacities="2,4,8,inf", params_path=out / "fit" / "policy.json",
                                      ablation=True, jobs=1))
    httpd = serve(StandInState(block_size=32, fail_every=5))
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        for name in ("first", "second"):
            run_replay(out, url, ReplayOptions(name=name, schedule=ScheduleOptions(speedup=20.0)))
    finally:
        httpd.shutdown()
        httpd.server_close()
    compare_replays(out / "replay" / "first", out / "replay" / "second")
    return run


@pytest.fixture(scope="session")
def bare_run(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    """A Mooncake-format trace (no types, turns, users or sessions) ingested, nothing else run."""
    trace = tmp_path_factory.mktemp("bare_trace") / "mooncake.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in [
        {"timestamp": 0, "input_length": 1024, "output_length": 8, "hash_ids": [1, 2]},
        {"timestamp": 500, "input_length": 1536, "output_length": 8, "hash_ids": [1, 2, 3]},
        {"timestamp": 2000, "input_length": 512, "output_length": 8, "hash_ids": [4]},
    ]))
    out = tmp_path_factory.mktemp("bare_run")
    ingest_trace(trace, out, infer_sessions=False)
    return open_run(out)
