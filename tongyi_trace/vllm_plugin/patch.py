"""Install the kvtrace free-block queue into vLLM 0.32.0 (imports vLLM: loaded only inside the engine).

Two patches, both reversible by restarting the server without KVTRACE_POLICY:
- `vllm.v1.core.block_pool.FreeKVCacheBlockQueue` (the name BlockPool builds its queue with) becomes a
  factory returning a PolicyFreeQueue; if building it fails, vLLM's own queue is returned (counted).
- `KVCacheManager.free` and `KVCacheManager.pop_blocks_for_free` first tell the queue the category
  (SamplingParams.extra_args["kv_category"], sent as `vllm_xargs` by `kvtrace replay`), the trace time
  (extra_args["kv_time_s"], optional), the blocks' identities in the simulator's stream
  (extra_args["kv_block_keys"], optional: what the guard samples on) and the block positions of the
  request about to be released;
  `KVCacheManager.get_computed_blocks` (a request reaches the scheduler) advances the trace clock.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict
from typing import Any

from tongyi_trace.vllm_plugin.config import PluginConfig
from tongyi_trace.vllm_plugin.queue import PolicyFreeQueue
from tongyi_trace.vllm_plugin.stats import PluginStats

_installed = False


def request_tags(request: Any) -> tuple[object, float | None]:
    """The request's kv_category and kv_time_s (trace seconds) from its SamplingParams.extra_args."""
    sp = getattr(request, "sampling_params", None)
    extra = getattr(sp, "extra_args", None) if sp is not None else None
    if not isinstance(extra, dict):
        return None, None
    t = extra.get("kv_time_s")
    if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t):
        return extra.get("kv_category"), float(t)
    return extra.get("kv_category"), None


def request_block_keys(request: Any) -> list[int] | None:
    """The request's kv_block_keys (one integer per block, in request order) from its
    SamplingParams.extra_args; None when absent or not a list of integers."""
    sp = getattr(request, "sampling_params", None)
    extra = getattr(sp, "extra_args", None) if sp is not None else None
    keys = extra.get("kv_block_keys") if isinstance(extra, dict) else None
    if not isinstance(keys, list) or not all(isinstance(k, int) and not isinstance(k, bool) for k in keys):
        return None
    return keys


def install(config: PluginConfig, log: logging.Logger) -> None:
    """Patch vLLM so that every new BlockPool uses the configured eviction order."""
    global _installed
    if _installed:
        return
    import vllm
    from vllm.v1.core import block_pool, kv_cache_manager

    original_queue = block_pool.FreeKVCacheBlockQueue
    manager_cls = kv_cache_manager.KVCacheManager
    original_free = manager_cls.free
    original_pop = manager_cls.pop_blocks_for_free
    original_computed = manager_cls.get_computed_blocks
    shared: dict[str, PluginStats] = {}

    def stats() -> PluginStats:
        # Created with the first queue, i.e. only in the process that holds the KV cache.
        if "s" not in shared:
            shared["s"] = PluginStats(
                mode=config.policy.mode, stats_dir=config.stats_dir,
                info={"policy_path": str(config.policy_path), "vllm_version": vllm.__version__,
                      "categories": sorted(config.policy.categories),
                      "time_scale": config.policy.time_scale, "use_life": config.policy.use_life,
                      "conditional": config.policy.conditional, "use_offset": config.policy.use_offset,
                      # the guard's and the refit's settings, WA's parameter names (kvtrace compare reads them)
                      "guard_settings": asdict(config.policy.guard) if config.policy.guard else None})
        return shared["s"]

    def make_queue(blocks: list[Any]) -> Any:
        try:
            queue = PolicyFreeQueue(blocks, config.policy, stats())
        except Exception as e:  # never break serving
            if "s" in shared:
                shared["s"].record_fallback(f"queue not built: {type(e).__name__}: {e}")
            log.error("kvtrace plugin: could not build its queue (%s); this pool keeps vLLM's LRU", e)
            return original_queue(blocks)
        log.info("kvtrace plugin: eviction '%s' active on a pool of %d blocks; stats in %s",
                 config.policy.mode, len(blocks), config.stats_dir)
        return queue

    def annotate(manager: Any, request: Any) -> None:
        queue = manager.block_pool.free_block_queue
        if not isinstance(queue, PolicyFreeQueue):
            return
        try:
            category, time_s = request_tags(request)
            keys = request_block_keys(request)
            for single in manager.coordinator.single_type_managers:
                blocks = single.req_to_blocks.get(request.request_id)
                if blocks:
                    queue.note_request(blocks, category, time_s, keys)
        except Exception as e:  # the blocks keep their previous category and offset
            queue.stats.record_fallback(f"annotate: {type(e).__name__}: {e}")

    def free(self: Any, request: Any) -> None:
        annotate(self, request)
        original_free(self, request)

    def pop_blocks_for_free(self: Any, request: Any) -> Any:
        annotate(self, request)
        return original_pop(self, request)

    def get_computed_blocks(self: Any, request: Any) -> Any:
        queue = self.block_pool.free_block_queue
        if isinstance(queue, PolicyFreeQueue):
            try:
                _, time_s = request_tags(request)
                if time_s is not None:
                    queue.observe_time(time_s)
            except Exception as e:
                queue.stats.record_fallback(f"observe_time: {type(e).__name__}: {e}")
        return original_computed(self, request)

    get_computed_blocks.__doc__ = original_computed.__doc__
    free.__doc__ = original_free.__doc__
    pop_blocks_for_free.__doc__ = original_pop.__doc__
    block_pool.FreeKVCacheBlockQueue = make_queue
    manager_cls.free = free
    manager_cls.pop_blocks_for_free = pop_blocks_for_free
    manager_cls.get_computed_blocks = get_computed_blocks
    _installed = True
