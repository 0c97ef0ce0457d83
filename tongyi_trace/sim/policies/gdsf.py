"""GDSF (GreedyDual-Size-Frequency): evict the block with the lowest clock + frequency x cost / size.

    insert(x):  freq[x] = 1
    access(x):  freq[x] += 1 (pinned)
    release(x): hp[x] = L + freq[x] * cost(x) / size(x); push x with key (hp[x], stamp++)
    evict():    pop the smallest hp; L = hp of the victim   (the clock only grows)

cost(x) / size(x) for a KV block = the prefill work per token of recomputing it, by position:
    cost/size = 1 + (start_token + num_tokens / 2) / attn_scale_tokens
i.e. a linear (MLP/projection) term of 1 per token plus attention over the block's context
(start_token = pos x block_size), whose per-token cost equals the linear term at attn_scale_tokens of
context (about 2 x params / (4 x layers x hidden) tokens: ~37k for Qwen2-7B; default 32768).
Size is counted in tokens, so a partial last block is cheaper to keep.

Source: Cherkasova, "Improving WWW proxies performance with Greedy-Dual-Size-Frequency caching
policy", HP Labs 1998; the paper's baseline ("clock + frequency x cost / size"); libCacheSim GDSF.c.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from tongyi_trace.sim.policy_base import NUM_PARAMS, InitContext, PolicySpec, Setup, StateDecl
from tongyi_trace.sim.structs import heap_pop_valid, heap_push

KEY_SCALE = 2.0**32  # heap keys are int64: H is kept to 2^-32 (ties within that are broken by recency)


@dataclass(frozen=True)
class GdsfParams:
    """GDSF's recompute-cost model."""

    attn_scale_tokens: float = field(default=32768.0, metadata={
        "help": "context length at which attention costs as much per token as the linear layers"})
    block_size_tokens: float = field(default=0.0, metadata={
        "help": "tokens per block for start_token (0 = the simulated block size)"})

    def __post_init__(self) -> None:
        from tongyi_trace.errors import UsageError

        if not self.attn_scale_tokens > 0 or self.block_size_tokens < 0:
            raise UsageError("policy gdsf: attn_scale_tokens must be > 0 and block_size_tokens >= 0")

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(ip, fp) for the kernel: fp[FP_ATTN_SCALE], fp[FP_BLOCK_SIZE]."""
        fp = np.zeros(NUM_PARAMS, np.float64)
        fp[FP_ATTN_SCALE] = self.attn_scale_tokens
        fp[FP_BLOCK_SIZE] = self.block_size_tokens
        return np.zeros(NUM_PARAMS, np.int64), fp


FP_ATTN_SCALE, FP_BLOCK_SIZE = 0, 1  # fp slots
SPEC = PolicySpec("gdsf", GdsfParams, "GreedyDual-Size-Frequency, cost = recompute cost by position")
STATE = StateDecl(columns={"FREQ": "references since the block entered the cache (1 on insertion)"},
                  fslots={"CLOCK": "the inflation value L: the priority of the last victim"})
FREQ = STATE.col("FREQ")
CLOCK = STATE.fslot("CLOCK")


def init(params: GdsfParams, ctx: InitContext) -> Setup:
    """A heap over the cached blocks (equal priorities: the earlier released first); block_size_tokens 0
    becomes the stream's block size."""
    ip, fp = params.to_arrays()
    if fp[FP_BLOCK_SIZE] <= 0:
        fp[FP_BLOCK_SIZE] = float(ctx.stream.block_size)
    return Setup(ip, fp, heap_size=ctx.lazy_heap_entries, gf0=np.zeros(1))


@njit(cache=True, inline="always")
def access(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, x: int) -> None:
    bk[x, FREQ] += 1


@njit(cache=True, inline="always")
def insert(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, x: int) -> None:
    bk[x, FREQ] = 1


@njit(cache=True, inline="always")
def cost_per_token(pos: int, ntok: int, block_size: float, attn_scale: float) -> float:
    """Prefill work per token of a block at position POS (1 = linear layers only)."""
    return 1.0 + (pos * block_size + 0.5 * ntok) / attn_scale


@njit(cache=True, inline="always")
def release(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
            qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray,
            x: int, ref: int, pos: int, ntok: int, c: int, now: float) -> None:
    h = gf[CLOCK] + bk[x, FREQ] * cost_per_token(pos, ntok, fp[FP_BLOCK_SIZE], fp[FP_ATTN_SCALE])
    heap_push(bk, hp, g, x, int(h * KEY_SCALE))


@njit(cache=True, inline="always")
def evict(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, now: float) -> int:
    x, key1 = heap_pop_valid(bk, hp, g)
    if x >= 0:
        gf[CLOCK] = float(key1) / KEY_SCALE
    return x


SPEC = dataclasses.replace(SPEC, hooks=sys.modules[__name__])
