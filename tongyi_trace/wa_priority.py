"""The workload-aware (WA) eviction priority of paper section 4.2, in one place.

Priority of a cached block b = (ReuseProb_w(t, life), -offset), compared lexicographically; the LOWEST
priority is evicted first. w = category of the request that last accessed b, t = now - last access,
offset = b's block position in its request (deeper blocks go first on ties).

    ReuseProb_w(t, life) = F_w(t + life) - F_w(t) = p_w exp(-lambda_w t) (1 - exp(-lambda_w life))

with F_w(d) = p_w (1 - exp(-lambda_w d)). The conditional variant divides by 1 - F_w(t) (probability
of reuse in [t, t+life) given no reuse by t). Without the lifespan regulator (`use_life=False`) the
window is unbounded: ReuseProb = F_w(inf) - F_w(t) = p_w exp(-lambda_w t).

Plain Python on floats: the simulator compiles these same functions with numba, and the vLLM plugin
calls them as they are, so both run one definition.
"""

from __future__ import annotations

import math


def reuse_prob(p: float, rate_per_s: float, t_s: float, life_s: float, use_life: bool,
               conditional: bool) -> float:
    """Probability that a block last accessed t_s seconds ago is reused within the next life_s seconds."""
    decay = math.exp(-rate_per_s * t_s)
    window = 1.0 - math.exp(-rate_per_s * life_s) if use_life else 1.0
    prob = p * decay * window
    if conditional:
        survive = 1.0 - p + p * decay  # 1 - F_w(t)
        prob = prob / survive if survive > 0.0 else 0.0
    return prob


def evicts_before(prob_a: float, offset_a: int, prob_b: float, offset_b: int, use_offset: bool) -> bool:
    """True when block a has strictly lower WA priority than block b, i.e. a is evicted first."""
    if prob_a != prob_b:
        return prob_a < prob_b
    if use_offset:
        return offset_a > offset_b  # -offset: the deeper block has the lower priority
    return False
