"""SHARDS-style spatial sampling (Waldspurger et al., FAST'15): a block is in the sample when a 64-bit
mix of its identity falls below R x 2^64, so every reference to a sampled block is kept and a cache of
R x the capacity over the sampled blocks estimates the full cache's hit ratio. The mix is splitmix64's
finalizer (tongyi_trace/splitmix.py), for python integers (the plugin: vLLM block hashes) and numpy
arrays (the simulator: dense block ids).

The rate the shadows use (shadow_rate) is `sample_rate`, raised so that a shadow holds at least
MIN_SHADOW_BLOCKS blocks: a shadow of a hundred blocks (1/32 of a small cache) estimates its hit ratio
with errors of several points over minutes, and its eviction order over so few blocks is coarse. Large
caches keep `sample_rate`, so the cost stays bounded: at most MIN_SHADOW_BLOCKS / capacity of the
references reach the shadows beyond `sample_rate`'s."""

from __future__ import annotations

import numpy as np

from tongyi_trace.splitmix import mix64, splitmix64

_M64 = (1 << 64) - 1
MIN_SHADOW_BLOCKS = 512


def shadow_rate(sample_rate: float, capacity_blocks: int) -> float:
    """The sampling rate of the shadows of a cache of CAPACITY_BLOCKS: SAMPLE_RATE, or more so that a
    shadow holds MIN_SHADOW_BLOCKS (at most 1)."""
    return max(sample_rate, min(1.0, MIN_SHADOW_BLOCKS / max(capacity_blocks, 1)))


def threshold(rate: float) -> int:
    """The 64-bit cut-off of sampling rate RATE in (0, 1]."""
    return min(int(rate * 2.0**64), _M64 + 1)


def is_sampled(key: int, cut: int) -> bool:
    """Whether the block of identity KEY is in the sample of cut-off CUT (see threshold)."""
    return mix64(key) < cut


def sampled_mask(keys: np.ndarray, cut: int) -> np.ndarray:
    """is_sampled over an int64 array of identities (the same mix, vectorized)."""
    z = splitmix64(keys.astype(np.uint64))
    if cut > _M64:
        return np.ones(keys.shape, bool)
    return z < np.uint64(cut)
