"""The engine's guard, request for request: the plugin's queue with the guard on, driven as vLLM's BlockPool
drives it (shadow.ShadowCache.over), against the simulator's guarded driver in its engine mode
(simulate_guarded(per_request=True)) on the same stream. Both must hit the same blocks per request,
switch at the same requests with the same estimates, and refit at the same times to the same parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.guard.conftest import CAPACITY, T_SHIFT_S, shifted
from tongyi_trace.policy.file import CategoryParams, PolicyParams
from tongyi_trace.policy.guard import LRU, GuardSettings
from tongyi_trace.sim.guarded import simulate_guarded
from tongyi_trace.sim.stream import Stream
from tongyi_trace.vllm_plugin.queue import PolicyFreeQueue
from tongyi_trace.vllm_plugin.settings import QueuePolicy
from tongyi_trace.vllm_plugin.shadow import ShadowCache


@dataclass
class Block:
    block_id: int
    block_hash: int | None = None


def _cat(p: float, rate: float) -> CategoryParams:
    return CategoryParams(reuse_prob=p, rate_per_s=rate, mean_reuse_s=1 / rate, life_s=30.0)


# what a fit of the first half of the shifted stream says: "a" is reused, "b" almost never
FIT = PolicyParams(categories={"a": _cat(0.9, 0.01), "b": _cat(0.01, 0.001)}, default=_cat(0.5, 0.01))


def _plugin(stream: Stream, settings: GuardSettings, hash_salt: int = 0,
            send_keys: bool = False) -> tuple[list[int], PolicyFreeQueue]:
    """STREAM through the plugin's queue; hits per request and the queue. A block's hash is the stream's
    dense id (+ HASH_SALT: then it is like vLLM's, another identity than the simulator samples on); with
    SEND_KEYS each request also carries its dense ids, as `kvtrace replay` sends them (kv_block_keys)."""
    policy = QueuePolicy(mode="wa", categories=dict(FIT.categories),
                         default=FIT.default, guard=settings)
    queue = PolicyFreeQueue([Block(i) for i in range(CAPACITY + 1)], policy)
    pool = ShadowCache.over(queue)
    hits = []
    for r in range(stream.num_requests):
        keys = [int(k) for k in stream.blk[stream.req_off[r]:stream.req_off[r + 1]]]
        hits.append(pool.serve([k + hash_salt for k in keys], stream.categories[stream.req_cat[r]],
                               float(stream.req_time_s[r]), keys if send_keys else None))
    return hits, queue


@pytest.mark.parametrize(("sample_rate", "window_s"), [(1.0, 30.0), (0.25, 60.0)])
def test_plugin_guard_switches_and_hits_as_the_simulators_engine_mode(sample_rate: float, window_s: float) -> None:
    settings = GuardSettings(guard=True, guard_margin=0.2, guard_window_s=window_s, sample_rate=sample_rate)
    st = shifted()
    hits, queue = _plugin(st, settings)
    sim = simulate_guarded(st, "wa", CAPACITY, params={"guard": True, "guard_margin": 0.2,
                                                       "guard_window_s": window_s, "sample_rate": sample_rate},
                           fit=FIT, per_request=True, timing=False)
    g = queue.guard_ctl.guard
    assert g.switches == sim.switches  # time, mode and both windowed estimates (ratios of whole counts)
    assert sim.switches and sim.switches[0].to_mode == LRU and sim.switches[0].time_s > T_SHIFT_S
    assert g.time_in_mode_s == pytest.approx(sim.time_in_mode_s)
    assert hits == sim.result.req_hit_blocks.tolist()
    plain = simulate_guarded(st, "wa", CAPACITY, fit=FIT, timing=False).result.req_hit_blocks
    assert sum(hits) > int(plain.sum()), "the switch to LRU must change the cache's hits"
    assert g.mode == LRU



@pytest.mark.parametrize(("guard", "sample_rate", "window_s"), [(False, 1.0, 120.0), (True, 1.0, 120.0),
                                                                 (True, 0.25, 300.0)])
def test_plugin_refit_as_the_simulators_engine_mode(guard: bool, sample_rate: float, window_s: float) -> None:
    """The refit's decisions in the plugin equal the simulator's engine mode: the same refit times, the same
    categories refitted with the same new parameters, then the same hits and switches. At sample_rate 0.25
    the shadows take every block (shadow_rate: 200 blocks < MIN_SHADOW_BLOCKS) and the refit only the
    quarter of sample_rate, on both sides."""
    knobs = {"guard": guard, "guard_margin": 0.2, "guard_window_s": 30.0, "refit_s": 60.0, "window_s": window_s,
             "sample_rate": sample_rate}
    st = shifted()
    hits, queue = _plugin(st, GuardSettings(**knobs))
    sim = simulate_guarded(st, "wa", CAPACITY, params=knobs, fit=FIT, per_request=True, timing=False)
    ctl = queue.guard_ctl
    plugin_log, sim_log = _plugin_refits(queue), _sim_refits(sim.refits)
    assert plugin_log == sim_log
    assert sorted(plugin_log) == [60.0 * k for k in range(1, 20)]  # every 60 s of the 1,199-s stream
    late = {c: v for t, d in plugin_log.items() if t >= T_SHIFT_S + 2 * 60.0 for c, v in d.items()}
    assert late["b"][0] > 0.9  # the swap learned: "b" is now the reused one
    assert hits == sim.result.req_hit_blocks.tolist()
    if guard:
        assert ctl.guard.switches == sim.switches


def test_the_sent_block_keys_make_the_plugin_sample_the_simulators_blocks() -> None:
    """Below rate 1, with hashes that are not the simulator's ids (as vLLM's are not), the plugin samples
    other blocks than the simulator and refits to other parameters; when each request carries its blocks'
    ids (kv_block_keys, sent by `kvtrace replay`) it refits exactly as the simulator again."""
    knobs = {"guard": False, "refit_s": 60.0, "window_s": 300.0, "sample_rate": 0.25}
    st = shifted()
    sim = _sim_refits(simulate_guarded(st, "wa", CAPACITY, params=knobs, fit=FIT, per_request=True,
                                       timing=False).refits)
    salt = 1 << 40
    assert _plugin_refits(_plugin(st, GuardSettings(**knobs), salt)[1]) != sim
    assert _plugin_refits(_plugin(st, GuardSettings(**knobs), salt, send_keys=True)[1]) == sim


def _plugin_refits(queue: PolicyFreeQueue) -> dict[float, dict[str, tuple[float, float]]]:
    """Refit time -> refitted category -> (new reuse_prob, new rate_per_s), from the plugin's refit log."""
    assert queue.guard_ctl is not None
    return {e["time_s"]: {c: (v["new_reuse_prob"], v["new_rate_per_s"]) for c, v in e["refitted"].items()}
            for e in queue.guard_ctl.refit_log}


def _sim_refits(refits: list[dict[str, Any]]) -> dict[float, dict[str, tuple[float, float]]]:
    """The same from the simulator's refit rows."""
    out: dict[float, dict[str, tuple[float, float]]] = {}
    for r in refits:
        refitted = out.setdefault(r["time_s"], {})
        if r["refitted"]:
            refitted[r["category"]] = (r["new_reuse_prob"], r["new_rate_per_s"])
    return out
