"""SHARDS-style spatial sampling (Waldspurger et al., FAST'15): a block is in the sample when a 64-bit
mix of its identity falls below R x 2^64, so every reference to a sampled block is kept and a cache of
R x the capacity over the sampled blocks estimates the full cache's hit ratio. The mix is splitmix64's
finalizer, one definition for python integers (the plugin: vLLM block hashes) and numpy arrays (the
simulator: dense block ids)."""

from __future__ import annotations

import numpy as np

_M64 = (1 << 64) - 1
_C1, _C2, _C3 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def threshold(rate: float) -> int:
    """The 64-bit cut-off of sampling rate RATE in (0, 1]."""
    return min(int(rate * 2.0**64), _M64 + 1)


def mix64(key: int) -> int:
    """splitmix64's finalizer of KEY (any python int, taken modulo 2^64)."""
    z = (key + _C1) & _M64
    z = ((z ^ (z >> 30)) * _C2) & _M64
    z = ((z ^ (z >> 27)) * _C3) & _M64
    return z ^ (z >> 31)


def is_sampled(key: int, cut: int) -> bool:
    """Whether the block of identity KEY is in the sample of cut-off CUT (see threshold)."""
    return mix64(key) < cut


def sampled_mask(keys: np.ndarray, cut: int) -> np.ndarray:
    """is_sampled over an int64 array of identities (the same mix, vectorized)."""
    z = keys.astype(np.uint64) + np.uint64(_C1)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_C2)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_C3)
    z = z ^ (z >> np.uint64(31))
    if cut > _M64:
        return np.ones(keys.shape, bool)
    return z < np.uint64(cut)
