"""Scrape a vLLM server's Prometheus /metrics: prefix-cache counters and the cache configuration.

Definition. vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total count prompt tokens looked
up / found in the prefix cache, cumulative since the server started (requests resumed after preemption
are counted apart, in vllm:prefix_cache_preempted_*): a run's engine hit ratio is
    (hits_after - hits_before) / (queries_after - queries_before).
vllm:cache_config_info carries block_size and num_gpu_blocks as labels. Source: vLLM 0.32
vllm/v1/metrics/loggers.py, vllm/v1/core/kv_cache_manager.py (record_prefix_cache_stats).

The same ratio from the replay's records (`records_hit_ratio`, the one function replay's summary and
`kvtrace compare` use): sum cached_tokens / sum prompt_tokens over the completed requests whose server
reported cached_tokens. A request without cached_tokens (a server started without
--enable-prompt-tokens-details, or one that omits usage details) has an unknown hit count: it is left out
of both sums, never counted as 0, and the number of such requests and their prompt tokens are reported
beside the ratio.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import polars as pl

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
CACHE_INFO = "vllm:cache_config_info"


@dataclass(frozen=True)
class MetricsSnapshot:
    """The figures replay needs from one scrape (None when the server does not export them)."""

    hits_tokens: float | None
    queries_tokens: float | None
    block_size: int | None
    num_gpu_blocks: int | None
    cache_info: dict[str, str] = field(default_factory=dict)


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by metric name: [(labels, value)] from Prometheus text exposition format."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        if not math.isfinite(value):
            continue  # NaN / +Inf counters are nonsense for what replay reads
        labels = dict(_LABEL.findall(m.group(3) or ""))
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def _sum(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    vals = samples.get(name)
    return sum(v for _, v in vals) if vals else None


def _int_label(info: dict[str, str], key: str) -> int | None:
    try:
        v = int(info[key])
    except (KeyError, ValueError):
        return None
    return v if 0 < v < 2**40 else None


def snapshot_from_text(text: str) -> MetricsSnapshot:
    """Extract the prefix-cache counters (summed over engines) and the cache configuration."""
    s = parse_prometheus(text)
    info = s.get(CACHE_INFO, [({}, 0.0)])[0][0]
    return MetricsSnapshot(hits_tokens=_sum(s, HITS), queries_tokens=_sum(s, QUERIES),
                           block_size=_int_label(info, "block_size"),
                           num_gpu_blocks=_int_label(info, "num_gpu_blocks"), cache_info=info)


def delta_hit_ratio(before: MetricsSnapshot, after: MetricsSnapshot) -> tuple[float | None, float, float]:
    """(hit ratio, hit tokens, queried tokens) of what happened between two scrapes."""
    if None in (before.hits_tokens, before.queries_tokens, after.hits_tokens, after.queries_tokens):
        return None, 0.0, 0.0
    hits = float(after.hits_tokens or 0) - float(before.hits_tokens or 0)
    queries = float(after.queries_tokens or 0) - float(before.queries_tokens or 0)
    if queries <= 0 or not 0 <= hits <= queries:  # counters reset or nonsense: no ratio
        return None, 0.0, 0.0
    return hits / queries, hits, queries


@dataclass(frozen=True)
class RecordsHitRatio:
    """The engine hit ratio from a replay's records, with the requests it had to leave out."""

    hit_ratio: float | None  # cached_tokens / prompt_tokens over the requests counted; None when none
    num_requests: int  # completed requests counted (cached_tokens reported)
    cached_tokens: int
    prompt_tokens: int
    num_without_cached_tokens: int  # completed requests left out: the server reported no cached_tokens
    prompt_tokens_without_cached: int  # their prompt tokens

    def note(self) -> str | None:
        """One line saying what was left out, or None when every request was counted."""
        if not self.num_without_cached_tokens:
            return None
        return (f"{self.num_without_cached_tokens} completed requests ({self.prompt_tokens_without_cached} "
                "prompt tokens) carry no cached_tokens and are left out of the engine hit ratio (start vLLM "
                "with --enable-prompt-tokens-details)")


def records_hit_ratio(ok_records: pl.DataFrame) -> RecordsHitRatio:
    """The engine hit ratio over completed records (columns prompt_tokens, cached_tokens), nulls left out
    and counted (see the module doc)."""
    known = ok_records.filter(pl.col("cached_tokens").is_not_null())
    unknown = ok_records.filter(pl.col("cached_tokens").is_null())
    cached = int(known["cached_tokens"].sum() or 0)
    prompt = int(known["prompt_tokens"].sum() or 0)
    return RecordsHitRatio(hit_ratio=cached / prompt if prompt else None, num_requests=known.height,
                           cached_tokens=cached, prompt_tokens=prompt, num_without_cached_tokens=unknown.height,
                           prompt_tokens_without_cached=int(unknown["prompt_tokens"].sum() or 0))
