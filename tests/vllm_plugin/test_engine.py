"""The plugin inside the real CPU vLLM engine: it decides evictions, and refuses cleanly when it must."""

from __future__ import annotations

import json
import os
import random
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import polars as pl
import pytest

from tongyi_trace import engine
from tongyi_trace.policy.guard import GuardSettings
from tongyi_trace.vllm_plugin.stats import read_settled_stats, read_stats

pytestmark = [pytest.mark.engine, pytest.mark.full]  # own engine boots: make test-all only (tests/lanes.py)

# text-2 blocks are almost surely reused for a long time; text-1 blocks almost never; others between.
HAND_POLICY = {
    "schema": "kvtrace.policy/1",
    "categories": {
        "text-2": {"reuse_prob": 0.9, "rate_per_s": 0.01, "life_s": 600.0},
        "text-1": {"reuse_prob": 0.05, "rate_per_s": 1.0, "life_s": 1.0},
    },
    "default": {"reuse_prob": 0.3, "rate_per_s": 0.1, "life_s": 10.0},
}


def require_engine() -> None:
    """Skip with the reason when the CPU vLLM engine is not installed (`make test` installs it)."""
    if not engine.is_installed():
        pytest.skip("the CPU vLLM engine is not installed: run 'make vllm-engine' (kvtrace engine install)")


NUM_BLOCKS = 64          # x 32 tokens: room for 4 of the 16-block prompts below
PROMPT_TOKENS = 512


def complete(url: str, model: str, prompt: list[int], category: str | None) -> int:
    """Send one streamed completion; return the engine's cached_tokens for it."""
    body: dict[str, object] = {"model": model, "prompt": prompt, "max_tokens": 1, "min_tokens": 1,
                               "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if category is not None:
        body["vllm_xargs"] = {"kv_category": category}
    cached = -1
    with httpx.Client(timeout=300) as c, c.stream("POST", f"{url}/v1/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return cached


def cyclic_workload(url: str, model: str) -> dict[str, list[int]]:
    """6 distinct 16-block prompts (2 text-2, 2 text-1, 2 with no category) sent 3 times round-robin
    into a 64-block cache: under LRU every repeat misses (the cyclic pattern); WA keeps text-2."""
    rng = random.Random(7)
    prompts = [[rng.randrange(100, 30000) for _ in range(PROMPT_TOKENS)] for _ in range(6)]
    cats = ["text-2", "text-1", None, "text-2", "text-1", None]
    hits: dict[str, list[int]] = {}
    for rnd in range(3):
        for p, cat in zip(prompts, cats, strict=True):
            got = complete(url, model, p, cat)
            if rnd > 0:
                hits.setdefault(str(cat), []).append(got)
    return hits


@pytest.fixture(scope="module")
def wa_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[engine.EngineState, Path]]:
    require_engine()
    policy = tmp_path_factory.mktemp("wa_engine") / "policy.json"
    policy.write_text(json.dumps(HAND_POLICY))
    with warnings.catch_warnings():
        # engine.start drops its Popen handle while the server runs (ResourceWarning at return)
        warnings.simplefilter("ignore", ResourceWarning)
        st = engine.start(num_blocks=NUM_BLOCKS, block_size=32, max_model_len=1024, eviction="wa",
                          policy=policy, name="test-plugin-wa")
    try:
        assert st.stats_dir is not None
        yield st, Path(st.stats_dir)
    finally:
        engine.stop("test-plugin-wa")


def test_plugin_decides_evictions_and_keeps_the_hot_category(wa_engine: tuple[engine.EngineState, Path]) -> None:
    st, stats_dir = wa_engine
    hits = cyclic_workload(st.url, st.served_model_name)
    # text-2 repeats hit all but the last block (vLLM recomputes the last token): 15 x 32 tokens
    assert hits["text-2"] == [480] * 4
    assert hits["text-1"] == [0] * 4
    stats = None
    for _ in range(50):  # the engine writes its stats file within a second
        stats = read_stats(stats_dir)
        if stats and stats["evictions"] >= 16 * 4:
            break
        subprocess.run(["sleep", "0.2"], check=True)
    assert stats is not None, f"no stats file in {stats_dir}"
    assert stats["mode"] == "wa" and stats["fallbacks"] == 0
    assert stats["evictions"] > 0
    assert set(stats["evictions_by_category"]) <= {"text-1", "default"}
    assert stats["decision_mean_us"] is not None and stats["decision_p99_us"] >= stats["decision_p50_us"]
    log = Path(st.log_path).read_text()
    assert log.count("kvtrace plugin: eviction 'wa' active") == 1


def _plugin_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if "kvtrace plugin:" in ln]


def test_wrong_schema_policy_serves_with_lru_and_says_why_once(tmp_path: Path) -> None:
    require_engine()
    bad = tmp_path / "policy.json"
    bad.write_text(json.dumps({**HAND_POLICY, "schema": "kvtrace.policy/0"}))
    # the plugin's own refusal: the policy file goes to the engine unread (engine.start would refuse it)
    st = engine.start(num_blocks=NUM_BLOCKS, block_size=32, max_model_len=1024, policy=bad,
                      name=f"bad-policy-{os.getpid()}", stats_dir=tmp_path / "stats", check_policy=False)
    try:
        hits = cyclic_workload(st.url, st.served_model_name)
    finally:
        engine.stop(st.name)
    log_path = Path(st.log_path)
    assert hits["text-2"] == [0] * 4, "LRU on a cyclic pattern: every repeat misses"
    lines = _plugin_lines(log_path.read_text())
    assert len(lines) == 1, lines
    assert "'schema' is 'kvtrace.policy/0'" in lines[0] and "stays vLLM's LRU" in lines[0]
    assert not (tmp_path / "stats").exists()


PROBE = r"""
import multiprocessing as mp, sys
def probe():
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.v1.core import block_pool, kv_cache_utils
    pool = block_pool.BlockPool(8, True, 32)
    return type(pool.free_block_queue) is kv_cache_utils.FreeKVCacheBlockQueue
def child(q):
    q.put(probe())
if __name__ == "__main__":
    ok = probe()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start(); child_ok = q.get(); p.join()
    print("STOCK_QUEUE", ok, child_ok)
"""


def test_unsupported_vllm_version_leaves_vllm_untouched_and_logs_once(tmp_path: Path) -> None:
    """vLLM's own plugin loader in a parent and a spawned child (as API server and EngineCore), with the
    plugin pinned to another vLLM version (the KVTRACE_SUPPORTED_VLLM test hook)."""
    require_engine()
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(HAND_POLICY))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTRACE_")}
    env.update(KVTRACE_POLICY=str(policy), KVTRACE_STATS_DIR=str(tmp_path / "stats"),
               KVTRACE_SUPPORTED_VLLM="0.31.0")
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = subprocess.run([str(engine.venv_python()), str(script)], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "STOCK_QUEUE True True" in out.stdout
    lines = _plugin_lines(out.stderr)
    assert len(lines) == 1, lines
    assert "vLLM 0.32.0 is not the version this plugin was written against (0.31.0)" in lines[0]
    assert "stays vLLM's LRU" in lines[0]
    assert not (tmp_path / "stats").exists()


SIM_SPEEDUP = 20.0


def replay_with_plugin(run: Path, policy: Path, engine_name: str, replay_name: str,
                       max_output_tokens: int) -> tuple[engine.EngineState, dict[str, Any]]:
    """Replay RUN one request at a time on trace time into a 256-block engine running the plugin with
    POLICY; the engine's state and its plugin stats (checked: it evicted, never fell back)."""
    from tongyi_trace.replay.runner import ReplayOptions, run_replay
    from tongyi_trace.replay.schedule import ScheduleOptions

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        st = engine.start(num_blocks=256, block_size=32, max_model_len=4096, policy=policy,
                          name=engine_name, time_scale=SIM_SPEEDUP)
    try:
        opts = ReplayOptions(name=replay_name, schedule=ScheduleOptions(speedup=SIM_SPEEDUP,
                                                                        max_output_tokens=max_output_tokens),
                             max_in_flight=1, overwrite=True, policy_file=policy)
        run_replay(run, st.url, opts)
        assert st.stats_dir is not None
        stats = read_settled_stats(Path(st.stats_dir))  # once the engine wrote its last counts
    finally:
        engine.stop(engine_name)
    assert stats is not None and stats["evictions"] > 0 and stats["fallbacks"] == 0
    return st, stats


@pytest.fixture(scope="module")
def toc_slice(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A small to-C synthetic trace, ingested, with its own capacity-aware fit at the engine's cache size
    (255 blocks of 32 tokens = 510 trace blocks) and both context classes in its categories: (run folder,
    policy file)."""
    from tongyi_trace.fit.policy_fit import fit_policy
    from tongyi_trace.policy.file import PolicyChoice, load_policy, save_policy
    from tongyi_trace.trace.ingest import ingest_trace
    from tongyi_trace.trace.synth import synth_to_file

    d = tmp_path_factory.mktemp("toc_slice")
    synth_to_file("to-c", 3, d / "toc.jsonl", num_requests=160, duration_s=400.0)
    ingest_trace(d / "toc.jsonl", d / "run")
    policy = d / "policy.json"
    fit_policy(d / "run", policy, capacities="510", context="gap,pace")
    # The exactness checked below is the WA plugin's (LRU's is tests/replay/test_engine.py's): FIFO and
    # S3-FIFO without prefix closure can keep a block whose parent was evicted, which vLLM recomputes and
    # the simulator reuses (tests/vllm_plugin/test_same_order_as_simulator.py), so when the fit chose one
    # of those on this small slice, the choice is pinned to a prefix-closed WA setting (km model,
    # conditional, 30 s window).
    pol = load_policy(policy)
    if pol.choices[0].policy != "wa":
        wa = {"model": "km", "conditional": True, "life_s": 30.0, "leaf_only": True}
        save_policy(replace(pol, choices=[PolicyChoice(capacity="510", capacity_blocks=510, policy="wa",
                                                       params=wa)]), policy)
    return d / "run", policy


def test_engine_hits_equal_the_simulators_fitted_prediction(toc_slice: tuple[Path, Path]) -> None:
    """The plugin running the policy file's choice (mode fitted: prefix-closed WA or a baseline) with its
    defaults (the guard on), one request at a time on trace time: the engine's cached tokens equal the
    simulator's prediction (WA's defaults: predict_guarded) for every request."""
    require_engine()
    from tongyi_trace.policy.file import load_policy
    from tongyi_trace.replay.dispatch import request_body
    from tongyi_trace.replay.records import read_records
    from tongyi_trace.replay.schedule import ScheduledRequest
    from tongyi_trace.run import open_run
    from tongyi_trace.sim.engine_model import predict_request_hits
    from tongyi_trace.sim.guarded import predict_guarded

    probe = request_body("m", np.zeros(1, np.int64), ScheduledRequest(0, 0.0, 1, 1, "text-1", 0, None, 12.5))
    assert json.loads(probe)["vllm_xargs"] == {"kv_category": "text-1", "kv_time_s": 12.5}

    run, policy = toc_slice
    st, stats = replay_with_plugin(run, policy, "test-plugin-sim", "fitted", max_output_tokens=2)
    assert st.eviction == "fitted"
    recs = read_records(run / "replay" / "fitted" / "records.jsonl").filter(pl.col("status") == "ok").sort("sent_s")
    assert recs.height > 100
    assert recs["category"].str.contains(r"\|g\d").any() and recs["category"].str.contains(r"\|p[fs]").any()
    out_tok = recs["output_tokens"].fill_null(recs["max_tokens"]).to_numpy().astype(np.int64)
    guarded = predict_guarded(open_run(run).tables(), recs["req_idx"].to_numpy().astype(np.int64), 32, 256, "fitted",
                              load_policy(policy), {}, out_tok)
    assert guarded.shadow_capacity_blocks > 0, "the guard runs by default"
    assert (stats.get("guard") or {}).get("enabled") is True
    # the settings it was started with, in every stats file (what kvtrace compare predicts the engine with)
    assert stats["guard_settings"] == asdict(GuardSettings())
    predicted = guarded.result.req_hit_tokens
    lru = predict_request_hits(open_run(run).tables(), recs["req_idx"].to_numpy().astype(np.int64), 32, 256,
                               policy="lru", output_tokens=out_tok)
    engine_hits = recs["cached_tokens"].to_numpy().astype(np.int64)
    assert int(np.asarray(lru).sum()) != int(np.asarray(predicted).sum()), "the choice must differ from LRU here"
    assert engine_hits.tolist() == np.asarray(predicted).tolist()
    # the replay's own reconciliation simulates what the engine ran (the plugin's fitted), not LRU
    rec = json.loads((run / "replay" / "fitted" / "summary.json").read_text())["reconciliation"]
    assert rec["predicted_policy"] == "fitted" and "predicted_policy_note" not in rec
    assert (rec["exact_share"], rec["predicted_hit_tokens"]) == (1.0, int(np.asarray(predicted).sum()))


def test_engine_s3fifo_with_identical_requests_equals_the_simulator(tmp_path: Path) -> None:
    """The plugin running S3-FIFO (a policy file whose choice is s3fifo), one request at a time, on a trace
    where many requests repeat an earlier one exactly: the engine's cached tokens equal the simulator's
    prediction for every request. S3-FIFO's ghost remembers vLLM's block hashes and the block counter at
    each block's allocation, so two engine details show here: identical requests generate identical tokens,
    and without the replay's request-unique tail (replay/prompts.py) their output blocks would share a hash
    in vLLM while the simulator gives each an id of its own; and vLLM takes a request's partial block after
    its other blocks, which the simulator's kernel follows (both fail this test when undone)."""
    require_engine()
    from tongyi_trace.fit.policy_fit import fit_policy
    from tongyi_trace.policy.file import PolicyChoice, load_policy, save_policy
    from tongyi_trace.replay.reconcile import predict_hits
    from tongyi_trace.replay.records import read_records
    from tongyi_trace.run import open_run
    from tongyi_trace.trace.ingest import ingest_trace
    from tongyi_trace.trace.synth import synth_to_file

    synth_to_file("to-c", 5, tmp_path / "base.jsonl", num_requests=120, duration_s=300.0)
    rows = [json.loads(line) for line in (tmp_path / "base.jsonl").read_text().splitlines()]
    rng = random.Random(5)
    repeats = []
    for i, r in enumerate(rng.sample([r for r in rows if r["input_length"] < 2000], 50)):
        repeats.append({**r, "chat_id": 10_000 + i, "parent_chat_id": -1, "turn": 1,
                        "timestamp": round(r["timestamp"] + rng.uniform(20.0, 120.0), 3)})
    trace = sorted(rows + repeats, key=lambda r: r["timestamp"])
    (tmp_path / "toc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trace))
    ingest_trace(tmp_path / "toc.jsonl", tmp_path / "run")
    policy = tmp_path / "policy.json"
    fit_policy(tmp_path / "run", policy, capacities="510")
    pol = load_policy(policy)
    save_policy(replace(pol, choices=[PolicyChoice(capacity="510", capacity_blocks=510, policy="s3fifo",
                                                   params={})]), policy)
    # 40 output tokens: every request fills an output block (with 4, only prompts ending 29-31 tokens into a
    # block do)
    replay_with_plugin(tmp_path / "run", policy, "test-plugin-s3fifo", "s3fifo", max_output_tokens=40)
    rec = json.loads((tmp_path / "run" / "replay" / "s3fifo" / "summary.json").read_text())["reconciliation"]
    assert rec["predicted_policy"] == "fitted" and rec["num_requests"] > 120
    assert rec["exact_share"] == 1.0, rec["worst"]
    recs = read_records(tmp_path / "run" / "replay" / "s3fifo" / "records.jsonl").filter(pl.col("status") == "ok")
    lru = predict_hits(open_run(tmp_path / "run"), recs.sort("sent_s"), 32, 256)
    assert int(lru.sum()) != rec["predicted_hit_tokens"], "S3-FIFO must hit differently from LRU here"
