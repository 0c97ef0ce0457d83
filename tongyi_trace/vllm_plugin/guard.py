"""The guard and the online refit inside the engine (the shared logic is tongyi_trace.policy.guard).

Each request the plugin sees released (`PolicyFreeQueue.note_request`) is reduced to its hash-sampled
blocks (tongyi_trace.policy.sampling on a block's identity: the first 8 bytes of vLLM's block hash, or,
when the request carries kv_block_keys, the simulator's id of the block, which `kvtrace replay` sends so
that the engine and the simulator sample the same blocks at any rate) and served by two shadow
caches of R x the pool (R = policy.sampling.shadow_rate: sample_rate, raised so a shadow holds at least
MIN_SHADOW_BLOCKS blocks; shadow.py: the plugin's own queue in LRU order and in the policy's);
the guard (tongyi_trace.policy.guard) compares them and the queue evicts in LRU order while the guard
says so. In the engine both sides come from shadows (the simulator measures the running order on the
cache itself). With refit_s > 0 the sampled accesses feed a ReuseWindow and the policy's per-category
parameters are refitted every refit_s seconds of the policy clock (tongyi_trace.policy.refit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from tongyi_trace.policy.guard import LRU, Guard, GuardSettings, Switch
from tongyi_trace.policy.refit import CategoryFit, RefitClock, ReuseWindow, refit
from tongyi_trace.policy.sampling import is_sampled, shadow_rate, threshold
from tongyi_trace.vllm_plugin.shadow import ShadowCache
from tongyi_trace.vllm_plugin.stats import PluginStats

_log = logging.getLogger("kvtrace.vllm_plugin")
_MAX_LOG = 50  # switches and refits kept in the stats file
_HALF = 1 << 63


def block_key(block_hash: Any) -> int:
    """A signed 64-bit identity of a vLLM block hash (its first 8 bytes; an int modulo 2^64; other objects:
    hash()): the refit's window holds identities as int64."""
    raw = getattr(block_hash, "block_hash", block_hash)  # BlockHashWithGroupId-like wrappers
    if isinstance(raw, bytes | bytearray):
        return int.from_bytes(raw[:8], "little", signed=True)
    if isinstance(raw, int):
        return (raw + _HALF) % (2 * _HALF) - _HALF
    return hash(raw)


class GuardControl:
    """Shadows, guard and refit of one PolicyFreeQueue (see the module doc)."""

    def __init__(self, settings: GuardSettings, policy: Any, capacity_blocks: int, names: list[str],
                 stats: PluginStats, queue_class: type[Any]) -> None:
        self.settings = settings
        self.sample_rate = shadow_rate(settings.sample_rate, capacity_blocks)
        self.cut = threshold(self.sample_rate)
        self.refit_cut = threshold(settings.sample_rate)  # the refit's sample: see policy/refit.py
        self.shadow_capacity_blocks = max(1, round(self.sample_rate * capacity_blocks))
        self.lru = ShadowCache(self.shadow_capacity_blocks, replace(policy, mode="lru", leaf_only=False, guard=None),
                               queue_class)
        self.pol = ShadowCache(self.shadow_capacity_blocks, replace(policy, mode="wa", guard=None), queue_class)
        self.guard = Guard(settings.guard_margin, settings.guard_window_s) if settings.guard else None
        self.window = ReuseWindow(settings.window_s) if settings.refit_s > 0 else None
        self.names = names
        self.stats = stats
        self.model = self.pol.queue._model
        self.clock = RefitClock(settings.refit_s)
        self.refits = 0
        self.refit_log: list[dict[str, Any]] = []
        self.category_metrics: dict[str, dict[str, float]] = {}
        self.sampled_refs = 0
        self.shadow_hits = {"policy": 0, LRU: 0}
        stats.sections["guard"] = self.snapshot

    @property
    def lru_order(self) -> bool:
        """Whether the queue must evict in LRU order now."""
        return self.guard is not None and self.guard.mode == LRU

    def on_request(self, keys: list[int], category_index: int, time_s: float,
                   current_fits: Callable[[], dict[int, CategoryFit]]) -> dict[int, CategoryFit]:
        """A request of CATEGORY_INDEX at TIME_S released blocks of identities KEYS; returns the refitted
        categories (empty unless a refit ran). CURRENT_FITS: the queue's parameters per category index."""
        sampled = [k for k in keys if is_sampled(k, self.cut)]
        name = self.names[category_index]
        if sampled:
            lh = self.lru.serve(sampled, name, time_s)
            ph = self.pol.serve(sampled, name, time_s)
            self.sampled_refs += len(sampled)
            self.shadow_hits["policy"] += ph
            self.shadow_hits[LRU] += lh
            if self.guard is not None:
                sw = self.guard.observe_warm(time_s, len(sampled), ph, lh, self.lru.queue.stats.evictions)
                if sw is not None:
                    self._log_switch(sw)
            if self.window is not None:
                mine = [k for k in sampled if is_sampled(k, self.refit_cut)]
                n = len(mine)
                self.window.add(np.array(mine, np.int64), np.full(n, category_index), np.full(n, time_s))
        if self.window is None or not self.clock.due(time_s):
            return {}
        current = current_fits()
        fits, metrics = refit(self.window.samples(time_s), current, self.model)
        self.refits += 1
        self.category_metrics = {self.names[c]: m for c, m in metrics.items()}
        change = {self.names[c]: {"old_reuse_prob": current[c].reuse_prob, "new_reuse_prob": f.reuse_prob,
                                  "old_rate_per_s": current[c].rate_per_s, "new_rate_per_s": f.rate_per_s,
                                  "ks_before": metrics[c]["ks"]} for c, f in fits.items()}
        self.refit_log = [*self.refit_log, {"time_s": time_s, "refitted": change}][-_MAX_LOG:]
        if fits:
            _log.info("kvtrace guard: refit at %.1f s: %s", time_s, ", ".join(sorted(change)))
        self.stats.maybe_flush()
        self.pol.queue.set_category_fits(fits)
        return fits

    def _log_switch(self, sw: Switch) -> None:
        _log.info("kvtrace guard: switch to %s at %.1f s (window hit ratio: policy %.4f, lru %.4f)",
                  sw.to_mode, sw.time_s, sw.policy_hit_ratio, sw.lru_hit_ratio)
        self.stats.maybe_flush()

    def snapshot(self) -> dict[str, Any]:
        """The guard's part of plugin_stats.json."""
        g = self.guard
        pol, lru, n = g.estimates() if g is not None else (0.0, 0.0, 0)
        return {
            "enabled": g is not None, "refit_s": self.settings.refit_s, "sample_rate": self.sample_rate,
            "refit_sample_rate": self.settings.sample_rate,
            "shadow_capacity_blocks": self.shadow_capacity_blocks,
            "mode": g.mode if g is not None else "policy",
            "switches": len(g.switches) if g is not None else 0,
            "switch_log": [sw.__dict__ for sw in (g.switches[-_MAX_LOG:] if g is not None else [])],
            "time_in_mode_s": dict(g.time_in_mode_s) if g is not None else {},
            "window_policy_hit_ratio": pol, "window_lru_hit_ratio": lru, "window_sampled_refs": n,
            "sampled_refs": self.sampled_refs, "shadow_hits": dict(self.shadow_hits),
            "refits": self.refits, "refit_log": list(self.refit_log),
            "category_metrics": dict(self.category_metrics),
        }
