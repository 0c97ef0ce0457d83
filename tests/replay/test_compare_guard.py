"""compare predicts the WA plugin with the guard it ran: the settings its stats record, none when it ran WA
without the guard section, WA's defaults (the guard on) when no plugin ran."""

from __future__ import annotations

from dataclasses import asdict

from tongyi_trace.guard.decide import GuardSettings
from tongyi_trace.replay.compare import guard_params
from tongyi_trace.sim.policies.wa import WaParams


def test_the_plugins_recorded_settings_are_used() -> None:
    ran = GuardSettings(guard=True, guard_margin=2.5, guard_window_s=30.0, refit_s=60.0, window_s=300.0,
                        sample_rate=0.25)
    stats = {"mode": "fitted", "guard": {"enabled": True, "settings": asdict(ran), "switches": 3}}
    got = guard_params(stats)
    assert got == {"guard": True, "guard_margin": 2.5, "guard_window_s": 30.0, "refit_s": 60.0,
                   "window_s": 300.0, "sample_rate": 0.25}
    assert WaParams(**got).guard_settings() == ran  # the names are WA's parameters


def test_wa_without_a_guard_section_ran_bare_and_no_plugin_means_the_defaults() -> None:
    assert guard_params({"mode": "wa", "evictions": 10}) == {"guard": False, "refit_s": 0.0}
    assert guard_params({"mode": "fitted"}) == {"guard": False, "refit_s": 0.0}
    assert guard_params({"mode": "lru"}) == {}  # a baseline in the plugin: WA's prediction is the default's
    assert guard_params(None) == {}
    assert WaParams(**guard_params(None)).guard is True  # the default: the guard on
    # a stats file from before the settings were recorded: the defaults
    assert guard_params({"mode": "wa", "guard": {"enabled": True, "refit_s": 0.0}}) == {}
