"""Prefix-chained block identity.

chain_k = mix(chain_{k-1}, block_id_k) with chain_{-1} = a fixed seed: two blocks get the same chain id
iff every block from position 0 up to and including them is equal (up to 64-bit hash collisions,
probability ~ n^2 / 2^65). Bailian (Qwen) hash ids are per-block content hashes, so the engine-visible
identity must be derived this way; for already-chained ids (Mooncake) it yields the same partition.
mix(h, b) = splitmix64(h ^ splitmix64(b)), splitmix64 as defined in tongyi_trace/splitmix.py.

Vectorised with numpy (no compiler, so ingest starts fast): the chain is sequential along a request but
independent across requests, so step p advances every request longer than p at once (the requests ordered
longest first, those are a prefix of the order): one gather, the mix and one scatter, in place.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tongyi_trace.splitmix import splitmix64_inplace

_SEED = np.uint64(0x6B76747261636521)  # "kvtrace!"
_SLICE = 1 << 16  # ids mixed per step of the first pass


def chain_ids(block_ids: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Prefix-chained 64-bit ids (as int64) for flat BLOCK_IDS split into requests at OFFSETS (len N+1)."""
    out = np.array(block_ids, dtype=np.int64).view(np.uint64)  # mixed, then chained, in place
    tmp = np.empty(min(out.shape[0], _SLICE), dtype=np.uint64)
    for i in range(0, out.shape[0], _SLICE):  # slices: the scratch stays small (no page faults per step)
        splitmix64_inplace(out[i:i + _SLICE], tmp[:min(_SLICE, out.shape[0] - i)])
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    if out.shape[0] == 0:
        return out.view(np.int64)
    order = np.argsort(-lengths, kind="stable")  # requests, longest first
    starts = offsets[:-1][order]
    max_len = int(lengths[order[0]])
    running = lengths.shape[0] - np.cumsum(np.bincount(lengths, minlength=max_len + 1))[:max_len]  # longer than p
    h = np.full(int(running[0]), _SEED, dtype=np.uint64)
    tmp = np.empty_like(h)
    idx = np.empty(h.shape[0], dtype=np.int64)
    for p in range(max_len):
        n = int(running[p])
        hp, t, ix = h[:n], tmp[:n], idx[:n]
        np.add(starts[:n], p, out=ix)
        np.take(out, ix, out=t)
        hp ^= t  # h = splitmix64(h ^ splitmix64(block))
        splitmix64_inplace(hp, t)
        out[ix] = hp
    return out.view(np.int64)
