"""The guard inside the real CPU vLLM engine: the plugin runs WA with the guard on (KVTRACE_GUARD*), a
to-C slice is replayed one request at a time on trace time, and the engine's cached tokens and the guard's
counters equal the simulator's guarded prediction (tongyi_trace.sim.guarded.predict_guarded, the
engine's guard: one step per request, both orders on their shadows)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.vllm_plugin.test_engine import SIM_SPEEDUP, require_engine, toc_slice  # noqa: F401 (fixture)
from tongyi_trace import engine
from tongyi_trace.policy.guard import GuardSettings
from tongyi_trace.vllm_plugin.stats import read_settled_stats

pytestmark = [pytest.mark.engine, pytest.mark.full]  # own engine boots: make test-all only (tests/lanes.py)

# At 639 usable blocks the slice's own fit (prefix-closed WA, exp model) and LRU trade the lead: with a
# 10-s window and no margin (any significant lead switches) the guard goes to LRU and back (predicted with
# the 135 requests the replay sends and their output tokens: to LRU at 78.8, back at 173.4, to LRU again
# at 212.3 trace seconds; every block count from 512 to 704 gives these three). The shadows sample 512 of
# 639 blocks (shadow_rate: sample_rate 0.25 raised to MIN_SHADOW_BLOCKS) and the refit, every 60 s, a
# quarter of them: both sides sample the same blocks because the replay sends each request's block ids
# (kv_block_keys), which the plugin samples on instead of vLLM's block hashes.
NUM_BLOCKS, BLOCK_SIZE = 640, 32
GUARD = {"guard": True, "guard_margin": 0.0, "guard_window_s": 10.0, "sample_rate": 0.25, "refit_s": 60.0,
         "window_s": 120.0}


def _wa_policy(fitted: Path, out: Path) -> Path:
    """FITTED's reuse models with one choice: prefix-closed WA (exp model) at this engine's capacity."""
    from dataclasses import replace

    from tongyi_trace.policy.file import PolicyChoice, load_policy, save_policy

    pol = load_policy(fitted)
    capacity = (NUM_BLOCKS - 1) * BLOCK_SIZE // pol.block_size
    save_policy(replace(pol, choices=[PolicyChoice(capacity=str(capacity), capacity_blocks=capacity, policy="wa",
                                                   params={"leaf_only": True})]), out)
    return out


def _start(policy: Path, state: Path) -> engine.EngineState:
    """The engine with the guard's settings (GUARD) and the plugin's counters in STATE/stats."""
    return engine.start(num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, max_model_len=4096, policy=policy,
                        name=f"guard-{os.getpid()}", time_scale=SIM_SPEEDUP, guard=GuardSettings(**GUARD),
                        stats_dir=state / "stats")


def test_engine_guard_equals_the_simulators_guarded_prediction(toc_slice: tuple[Path, Path],  # noqa: F811
                                                               tmp_path: Path) -> None:
    require_engine()
    from tongyi_trace.policy.file import load_policy
    from tongyi_trace.replay.records import read_records
    from tongyi_trace.replay.runner import ReplayOptions, run_replay
    from tongyi_trace.replay.schedule import ScheduleOptions
    from tongyi_trace.run import open_run
    from tongyi_trace.sim.guarded import predict_guarded

    run, fitted = toc_slice
    policy = _wa_policy(fitted, tmp_path / "policy.json")
    st = _start(policy, tmp_path)
    url = st.url
    try:
        opts = ReplayOptions(name="guard", schedule=ScheduleOptions(speedup=SIM_SPEEDUP, max_output_tokens=2),
                             max_in_flight=1, overwrite=True, policy_file=policy)
        run_replay(run, url, opts)
        stats = read_settled_stats(tmp_path / "stats")  # once the engine wrote its last counts
    finally:
        engine.stop(st.name)
    assert stats is not None and stats["mode"] == "fitted" and stats["fallbacks"] == 0
    recs = read_records(run / "replay" / "guard" / "records.jsonl").filter(pl.col("status") == "ok").sort("sent_s")
    assert recs.height > 100
    out_tok = recs["output_tokens"].fill_null(recs["max_tokens"]).to_numpy().astype(np.int64)
    sim = predict_guarded(open_run(run).tables(), recs["req_idx"].to_numpy().astype(np.int64), BLOCK_SIZE, NUM_BLOCKS,
                          "fitted", load_policy(policy), GUARD, out_tok)
    g = stats["guard"]
    assert g["enabled"] and g["refit_sample_rate"] == 0.25 and g["sample_rate"] < 1.0
    assert g["shadow_capacity_blocks"] == sim.shadow_capacity_blocks == 512
    # the guard's inputs: every sampled reference and both shadows' hits
    tl = sim.timeline
    assert g["sampled_refs"] == sum(r["num_sampled_refs"] for r in tl)
    assert g["shadow_hits"] == {
        "policy": round(sum(r["shadow_policy_hit_ratio"] * r["num_sampled_refs"] for r in tl if r["num_sampled_refs"])),
        "lru": round(sum(r["shadow_lru_hit_ratio"] * r["num_sampled_refs"] for r in tl if r["num_sampled_refs"]))}
    assert g["shadow_hits"]["policy"] != g["shadow_hits"]["lru"]
    # its decisions
    assert [s.to_mode for s in sim.switches][:2] == ["lru", "policy"], "the guard must switch both ways here"
    assert g["switches"] == len(sim.switches)
    assert [(s["time_s"], s["to_mode"]) for s in g["switch_log"]] == [(s.time_s, s.to_mode) for s in sim.switches]
    assert g["time_in_mode_s"] == pytest.approx(sim.time_in_mode_s)
    assert g["window_policy_hit_ratio"] == pytest.approx(tl[-1]["window_policy_hit_ratio"])
    assert g["window_lru_hit_ratio"] == pytest.approx(tl[-1]["window_lru_hit_ratio"])
    # the refits: when, and what each saw of every category (the refit's quarter of the sampled blocks)
    times = sorted({r["time_s"] for r in sim.refits})
    assert g["refits"] == len(times) >= 5
    last = {r["category"]: r["num_samples"] for r in sim.refits if r["time_s"] == times[-1]}
    assert {c: m["num_samples"] for c, m in g["category_metrics"].items()} == last
    assert [{c: v["new_reuse_prob"] for c, v in e["refitted"].items()} for e in g["refit_log"]] == [
        {r["category"]: r["new_reuse_prob"] for r in sim.refits if r["time_s"] == t and r["refitted"]} for t in times]
    # and the cache's hits, request for request
    assert recs["cached_tokens"].to_numpy().astype(np.int64).tolist() == sim.result.req_hit_tokens.tolist()
