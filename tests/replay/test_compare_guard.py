"""compare predicts the WA plugin with the guard it was started with: the settings its stats record (every
stats file: `guard_settings`), WA's defaults (the guard on) when no plugin ran or the file predates them."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from tongyi_trace.policy.file import CategoryParams, PolicyChoice, PolicyParams
from tongyi_trace.policy.guard import GuardSettings
from tongyi_trace.replay.reconcile import guard_params
from tongyi_trace.run import open_run
from tongyi_trace.sim.engine_model import predict_request_hits
from tongyi_trace.sim.guarded import predict_guarded
from tongyi_trace.sim.policies.wa import WaParams


def test_the_plugins_recorded_settings_are_used() -> None:
    ran = GuardSettings(guard=True, guard_margin=2.5, guard_window_s=30.0, refit_s=60.0, window_s=300.0,
                        sample_rate=0.25)
    stats = {"mode": "fitted", "guard_settings": asdict(ran), "guard": {"enabled": True, "switches": 3}}
    got = guard_params(stats)
    assert got == {"guard": True, "guard_margin": 2.5, "guard_window_s": 30.0, "refit_s": 60.0,
                   "window_s": 300.0, "sample_rate": 0.25}
    assert WaParams(**got).guard_settings() == ran  # the names are WA's parameters
    # the guard turned off (KVTRACE_GUARD=0): no guard section, the bare policy predicted
    off = asdict(GuardSettings(guard=False))
    assert guard_params({"mode": "wa", "evictions": 10, "guard_settings": off})["guard"] is False
    # a baseline in the plugin: the settings it would have guarded WA with
    assert guard_params({"mode": "lru", "guard_settings": off}) == off


def test_no_plugin_or_no_recorded_settings_means_the_defaults() -> None:
    assert guard_params(None) == {}
    assert WaParams(**guard_params(None)).guard is True  # the default: the guard on
    # a stats file from before the settings were recorded
    assert guard_params({"mode": "wa", "guard": {"enabled": True, "refit_s": 0.0}}) == {}


def test_fitted_resolving_to_a_baseline_is_predicted_plain(tiny_run: Path) -> None:
    """The plugin guards WA only: where the file chose a baseline for the engine's cache, the guard
    settings compare passes (WA's parameter names) leave the baseline's prediction as it is."""
    req_idx = np.arange(6, dtype=np.int64)
    base = PolicyParams(categories={"text": CategoryParams(0.9, 0.01, 600.0, 600.0)},
                        default=CategoryParams(0.3, 0.001, 600.0, 600.0))
    s3 = replace(base, choices=[PolicyChoice(capacity="4", capacity_blocks=4, policy="s3fifo", params={})])
    run = open_run(tiny_run)
    got = predict_guarded(run.tables(), req_idx, 32, 4, "fitted", s3, {"guard": False, "refit_s": 0.0})
    want = predict_request_hits(run.tables(), req_idx, 32, 4, policy="s3fifo", params=s3)
    assert got.shadow_capacity_blocks == 0 and got.result.req_hit_tokens.tolist() == np.asarray(want).tolist()
    assert int(np.asarray(want).sum()) > 0  # the tiny trace hits at 4 blocks: a real comparison
    wa = replace(base, choices=[PolicyChoice(capacity="4", capacity_blocks=4, policy="wa", params={})])
    guarded = predict_guarded(run.tables(), req_idx, 32, 4, "fitted", wa, {})
    assert guarded.shadow_capacity_blocks > 0  # WA: the guard runs (WA's defaults)
