"""Cache capacities as the user writes them, resolved to blocks.

    4096      blocks
    5%        percent of the distinct blocks of the (regrouped) stream
    0.5x      times the HBM left for KV of a model preset (tongyi_trace.models), in blocks of the
              simulated block size
    2L        times the oracle's peak live set (blocks already computed that are used again later,
              at the busiest request boundary: the capacity an oracle needs for the ideal hit ratio)
    40GiB     bytes of KV cache (B, KB, MB, GB, TB in powers of 1000; KiB, MiB, GiB, TiB in powers of
              1024), converted with the model's KV bytes per block of the simulated block size (rounded
              to the nearest block)
    inf       unlimited (the ideal)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
from numba import njit

from tongyi_trace.errors import UsageError
from tongyi_trace.models import ModelPreset


@dataclass(frozen=True)
class Capacity:
    """One capacity of a sweep: how it was written and its size in blocks."""

    label: str
    num_blocks: int
    bytes_per_block: int | None = None  # set when the label is in bytes: the model's KV bytes per block

    @property
    def num_bytes(self) -> int | None:
        """The capacity's KV bytes (None unless it was given in bytes)."""
        return None if self.bytes_per_block is None else self.num_blocks * self.bytes_per_block


@njit(cache=True)
def peak_live_blocks(req_off: np.ndarray, next_req: np.ndarray) -> int:
    """Max over request boundaries of the blocks used so far whose next use is still to come."""
    n = req_off.shape[0] - 1
    diff = np.zeros(n + 1, np.int64)
    for r in range(n):
        for i in range(req_off[r], req_off[r + 1]):
            if next_req[i] < n:
                diff[r] += 1
                diff[next_req[i]] -= 1
    best = 0
    live = 0
    for r in range(n):
        live += diff[r]
        if live > best:
            best = live
    return best


MAX_BLOCKS = 10**15  # far beyond any cache; a bound so that inf% or 1e400x is an error, not an overflow


def _rounded(item: str, blocks: float) -> int:
    if not math.isfinite(blocks):
        raise UsageError(f"capacity {item!r} is not a finite size; give e.g. 5%, 0.5x, 2L or inf for the ideal")
    return round(blocks)


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_BYTES = re.compile(r"^([0-9.eE+-]+)\s*(b|kb|mb|gb|tb|kib|mib|gib|tib)$")


def parse_bytes(item: str) -> float | None:
    """'40GiB' -> 42949672960.0; None when ITEM has no byte unit."""
    m = _BYTES.match(item.strip().lower())
    return None if m is None else float(m.group(1)) * _UNITS[m.group(2)]


def parse_capacities(text: str, *, num_distinct: int, block_size_tokens: int, model: ModelPreset | None,
                     peak_live: int | None = None) -> list[Capacity]:
    """Resolve a comma-separated capacity list (see the module doc) to blocks."""
    out: list[Capacity] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        low = item.lower()
        per_block = None
        try:
            num_bytes = parse_bytes(low)
            if num_bytes is not None:
                if model is None:
                    raise UsageError(f"capacity {item!r} is in bytes: give --model to convert it to blocks")
                per_block = model.kv_bytes_per_block(block_size_tokens)
                blocks = _rounded(item, num_bytes / per_block)
            elif low in ("inf", "ideal", "unlimited"):
                blocks = num_distinct
            elif low.endswith("%"):
                blocks = _rounded(item, float(low[:-1]) / 100.0 * num_distinct)
            elif low.endswith("x"):
                if model is None:
                    raise UsageError(f"capacity {item!r} is in x HBM: give --model")
                blocks = _rounded(item, float(low[:-1]) * model.hbm_blocks(block_size_tokens))
            elif low.endswith("l"):
                if peak_live is None:
                    raise UsageError(f"capacity {item!r} needs the oracle's peak live set")
                blocks = _rounded(item, float(low[:-1]) * peak_live)
            else:
                blocks = int(low)
        except ValueError:
            raise UsageError(f"capacity {item!r} is not a number of blocks, N%, Nx (x HBM), NL (x the "
                             "oracle's peak live set), bytes (40GiB, 200GB) or inf") from None
        if blocks < 1:
            why = (" (the oracle's peak live set is 0: no block of this trace is ever reused; give blocks or N%)"
                   if low.endswith("l") and peak_live == 0 else "")
            raise UsageError(f"capacity {item!r} is {blocks} blocks; it must be at least 1{why}")
        if blocks > MAX_BLOCKS:
            raise UsageError(f"capacity {item!r} is {blocks:.3g} blocks, more than {MAX_BLOCKS:.0e}; "
                             "give a finite size (or inf for the ideal)")
        out.append(Capacity(item, int(blocks), per_block))
    if not out:
        raise UsageError("--capacity is empty; give e.g. 4096,5%,1x")
    return out
