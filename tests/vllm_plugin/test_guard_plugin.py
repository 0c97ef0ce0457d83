"""The guard and the refit inside the plugin's queue, driven like the engine drives it (no vLLM):
blocks are allocated from the queue, released with note_request + append_n, hits taken with remove."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.guard.conftest import CAPACITY, T_SHIFT_S, shifted
from tongyi_trace.policy.file import CategoryParams
from tongyi_trace.policy.guard import LRU, GuardSettings
from tongyi_trace.policy.sampling import is_sampled, threshold
from tongyi_trace.vllm_plugin.config import PluginConfigError, guard_settings
from tongyi_trace.vllm_plugin.guard import block_key
from tongyi_trace.vllm_plugin.queue import PolicyFreeQueue
from tongyi_trace.vllm_plugin.settings import QueuePolicy
from tongyi_trace.vllm_plugin.shadow import ShadowCache
from tongyi_trace.vllm_plugin.stats import PROM_FILE, STATS_FILE, PluginStats


@dataclass
class Block:
    block_id: int
    block_hash: int | None = None


def _policy(guard: GuardSettings | None) -> QueuePolicy:
    """What the first half says (tests/guard/conftest.py): "a" is reused, "b" almost never."""
    return QueuePolicy(mode="wa", categories={"a": CategoryParams(0.9, 0.01, 100.0, 30.0),
                                              "b": CategoryParams(0.01, 0.001, 1000.0, 30.0)},
                       default=CategoryParams(0.5, 0.01, 100.0, 30.0), guard=guard)


def _replay(queue: PolicyFreeQueue, capacity: int) -> list[int]:
    """The shifted stream through QUEUE as vLLM's BlockPool would use it; hits per request."""
    st = shifted()
    pool = ShadowCache.over(queue)
    out = []
    for r in range(st.num_requests):
        keys = [int(k) + 1 for k in st.blk[st.req_off[r]:st.req_off[r + 1]]]
        out.append(pool.serve(keys, st.categories[st.req_cat[r]], float(st.req_time_s[r])))
    return out


def test_shadow_lru_equals_simulated_lru() -> None:
    from tongyi_trace.sim.simulate import simulate_policy

    st = shifted()
    shadow = ShadowCache(CAPACITY, QueuePolicy(mode="lru", categories={}, default=CategoryParams(0, 0, 0, 0)),
                         PolicyFreeQueue)
    hits = [shadow.serve([int(k) for k in st.blk[st.req_off[r]:st.req_off[r + 1]]], "a", float(st.req_time_s[r]))
            for r in range(st.num_requests)]
    assert hits == simulate_policy(st, "lru", CAPACITY).req_hit_blocks.tolist()


def test_guard_switches_the_engine_queue_to_lru(tmp_path) -> None:
    settings = GuardSettings(guard=True, guard_margin=0.2, guard_window_s=30.0, refit_s=0.0, window_s=600.0,
                             sample_rate=1.0)
    stats = PluginStats(mode="wa", stats_dir=tmp_path)
    blocks = [Block(i) for i in range(CAPACITY + 1)]
    guarded = PolicyFreeQueue(blocks, _policy(settings), stats)
    hits = _replay(guarded, CAPACITY)
    plain = _replay(PolicyFreeQueue([Block(i) for i in range(CAPACITY + 1)], _policy(None)), CAPACITY)
    st = shifted()
    late = [i for i in range(st.num_requests) if st.req_time_s[i] >= T_SHIFT_S]
    assert sum(hits[i] for i in late) > sum(plain[i] for i in late) + 1000  # stale WA loses the hot set
    g = guarded.guard_ctl.guard
    assert [s.to_mode for s in g.switches] == [LRU] and T_SHIFT_S < g.switches[0].time_s <= T_SHIFT_S + 60
    stats.write()
    doc = json.loads((tmp_path / STATS_FILE).read_text())
    assert doc["guard"]["mode"] == "lru" and doc["guard"]["switches"] == 1
    assert doc["guard"]["sample_rate"] == doc["guard"]["refit_sample_rate"] == 1.0
    assert doc["guard"]["switch_log"][0]["to_mode"] == "lru"
    assert sum(doc["hits_by_category"].values()) == doc["hits_on_free"] > 0
    prom = (tmp_path / PROM_FILE).read_text()
    assert 'kvtrace_guard_lru_mode{mode="wa"} 1.0' in prom
    assert 'kvtrace_guard_switches_total{mode="wa"} 1.0' in prom
    assert "# TYPE kvtrace_evictions_total counter" in prom


def test_refit_in_the_engine_learns_the_swap(tmp_path) -> None:
    settings = GuardSettings(guard=False, guard_margin=0.2, guard_window_s=30.0, refit_s=60.0, window_s=120.0,
                             sample_rate=1.0)
    stats = PluginStats(mode="wa", stats_dir=tmp_path)
    q = PolicyFreeQueue([Block(i) for i in range(CAPACITY + 1)], _policy(settings), stats)
    _replay(q, CAPACITY)
    fits = q.category_fits()
    names = q._names
    assert fits[names.index("a")].reuse_prob < 0.1 and fits[names.index("b")].reuse_prob > 0.9
    assert q.guard_ctl.refits == int((2 * T_SHIFT_S - 1) // 60)
    stats.write()
    prom = (tmp_path / PROM_FILE).read_text()
    assert 'kvtrace_reuse_cdf{mode="wa",category="b",kind="predicted",horizon_s="60"}' in prom


def test_small_pool_shadows_take_every_block_the_refit_its_rate(tmp_path) -> None:
    # 200 blocks < MIN_SHADOW_BLOCKS: the shadows sample every block (rate 1, 200 blocks each), the refit 1/4
    settings = GuardSettings(guard=True, refit_s=60.0, sample_rate=0.25)
    stats = PluginStats(mode="wa", stats_dir=tmp_path)
    q = PolicyFreeQueue([Block(i) for i in range(CAPACITY + 1)], _policy(settings), stats)
    _replay(q, CAPACITY)
    g = q.guard_ctl.snapshot()
    assert (g["sample_rate"], g["refit_sample_rate"], g["shadow_capacity_blocks"]) == (1.0, 0.25, CAPACITY)
    st = shifted()
    assert g["sampled_refs"] == st.num_refs  # every reference reached the shadows
    # the last refit's samples: the window's accesses (600 s before it) of the blocks sampled at 1/4 only
    end_s = g["refit_log"][-1]["time_s"]
    cut = threshold(0.25)
    in_window = [int(k) + 1 for r in range(st.num_requests) if end_s - 600.0 <= st.req_time_s[r] < end_s
                 for k in st.blk[st.req_off[r]:st.req_off[r + 1]]]
    want = sum(is_sampled(k, cut) for k in in_window)
    assert sum(m["num_samples"] for m in g["category_metrics"].values()) == want
    assert 0.15 < want / len(in_window) < 0.35


def test_guard_settings_from_the_environment() -> None:
    s = guard_settings({"KVTRACE_GUARD": "1", "KVTRACE_REFIT_S": "300"})
    assert s.guard and s.refit_s == 300.0 and s.active
    default = guard_settings({})  # the guard is on by default, the refit off
    assert default.guard and default.refit_s == 0.0 and default.active and default.guard_margin == 5.0
    off = guard_settings({"KVTRACE_GUARD": "0"})
    assert not off.guard and not off.active
    with pytest.raises(PluginConfigError, match="sample_rate"):
        guard_settings({"KVTRACE_SAMPLE_RATE": "2"})
    with pytest.raises(PluginConfigError, match="KVTRACE_REFIT_S"):
        guard_settings({"KVTRACE_REFIT_S": "soon"})


def test_the_plugins_settings_written_by_engine_start_read_back(tmp_path: Path) -> None:
    """plugin_env (what engine.start puts in the server's environment) and load_config (what the plugin
    reads there) agree on every setting: the policy, the mode, the clock, the block size, the stats folder
    and each of the guard's settings."""
    from tongyi_trace.policy.file import CategoryParams, PolicyParams, save_policy
    from tongyi_trace.vllm_plugin.config import load_config, plugin_env

    policy = tmp_path / "policy.json"
    save_policy(PolicyParams(categories={"text-1": CategoryParams(0.5, 0.1, 10.0, 9.0)},
                             default=CategoryParams(0.2, 0.1, 10.0, 9.0)), policy)
    guard = GuardSettings(guard=True, guard_margin=2.5, guard_window_s=30.0, refit_s=90.0, window_s=240.0,
                          sample_rate=0.125)
    env = plugin_env(policy, "wa", guard, 4.0, 32, tmp_path / "stats")
    assert env["KVTRACE_GUARD_MARGIN"] == "2.5" and env["KVTRACE_REFIT_WINDOW_S"] == "240.0"
    cfg = load_config(env)
    assert cfg.policy.guard == guard
    assert (cfg.policy.mode, cfg.policy.time_scale, cfg.policy.block_size) == ("wa", 4.0, 32)
    assert cfg.policy_path == policy.resolve() and cfg.stats_dir == tmp_path / "stats"
    assert cfg.policy.categories["text-1"].reuse_prob == 0.5
    off = load_config(plugin_env(policy, "lru", GuardSettings(guard=False), 1.0, 16, None))
    assert off.policy.guard == GuardSettings(guard=False) and off.stats_dir == policy.resolve().parent


def test_refit_on_vllm_block_hashes(tmp_path) -> None:
    """vLLM's block hashes are bytes whose first 8 bytes read as any 64-bit value: the refit's window (int64)
    takes them all, so the refit runs on every step, as with small ids, and never falls back."""
    settings = GuardSettings(guard=True, refit_s=60.0, sample_rate=0.25)
    stats = PluginStats(mode="wa", stats_dir=tmp_path)
    q = PolicyFreeQueue([Block(i) for i in range(CAPACITY + 1)], _policy(settings), stats)
    st = shifted()
    pool = ShadowCache.over(q)
    for r in range(st.num_requests):
        keys = [(int(k) * 0x9E3779B97F4A7C15 % (1 << 64)).to_bytes(8, "little") + b"rest of the hash"
                for k in st.blk[st.req_off[r]:st.req_off[r + 1]]]
        pool.serve(keys, st.categories[st.req_cat[r]], float(st.req_time_s[r]))  # type: ignore[arg-type]
    g = q.guard_ctl.snapshot()
    assert stats.fallbacks == 0 and g["refits"] == len(g["refit_log"]) == 19
    assert sum(m["num_samples"] for m in g["category_metrics"].values()) > 0
    keys = (b"\xff" * 8, (1 << 64) - 1, 1 << 63, b"\x01" + b"\x00" * 7)
    assert [block_key(k) for k in keys] == [-1, -1, -(1 << 63), 1]
