"""The workload-aware (WA) eviction priority of paper section 4.2, and the one total eviction order,
in one place: the simulator compiles these functions with numba and the vLLM plugin calls them as they
are, so both run one definition.

Priority of a cached block b = ReuseProb_w(t, life): the probability that b is reused within the next
`life` seconds, where w = category of the request that last accessed b and t = now - last access. Two
reuse models F_w(d) (probability that a block is reused within d seconds of an access):

    exp  F_w(d) = p_w (1 - exp(-lambda_w d))          (the paper's; fitted by censored MLE)
    km   F_w(d) = the censored Kaplan-Meier estimate, tabulated at KM_GRID_S (linear in between)

    ReuseProb_w(t, life) = F_w(t + life) - F_w(t)                        (unconditional, the paper's)
                         = (F_w(t + life) - F_w(t)) / (1 - F_w(t))     (conditional: given no reuse by t)

Without the lifespan regulator (`use_life=False`) the window is unbounded (life = inf).

The priority is compared as a natural logarithm, so that it never underflows to 0.0 for long idle blocks
(exp(-lambda t) is 0.0 in floating point past lambda t = 745). Blocks with no chance of reuse get -inf.

The eviction order is TOTAL and shared: the victim is the block with the smallest key
    (log ReuseProb, -offset, last access, block key)
i.e. lowest priority first; on equal priority the deeper block (larger offset); then the one accessed
longest ago; then the smaller block key: the simulator's block id. The engine knows it when the request
sends it (`kvtrace replay` sends every request's as kv_block_keys), so both break exact ties alike; a
block without one comes after, by vLLM's block id (vllm_plugin/queue.py). Exact ties are common where
requests share a timestamp (traces stamped to the second) and categories share a model (the fit pools
thin categories).
"""

from __future__ import annotations

import math

MODEL_EXP = 0
MODEL_KM = 1
MODELS = ("exp", "km")

# Kaplan-Meier grid: 0 s, then geometric from KM_T0_S by KM_RATIO (64 points up to ~2.3 days).
KM_NUM = 64
KM_T0_S = 0.05
KM_RATIO = 1.3


def km_grid_s() -> list[float]:
    """The time grid (seconds) at which the km model's F_w is tabulated: 0, then KM_T0_S * KM_RATIO^k."""
    return [0.0] + [KM_T0_S * KM_RATIO**k for k in range(KM_NUM - 1)]


KM_GRID_S = tuple(km_grid_s())


def km_cdf(table: object, d_s: float) -> float:
    """F(d_s) from a table of F at km_grid_s() (linear interpolation; flat past the last point; d_s = inf
    allowed: the unbounded window of use_life=False). The grid points are read from KM_GRID_S and the
    segment is settled by comparing with them, so that the compiled copy (whose power and logarithm may
    round differently) gives the same float as this one: equal priorities stay equal in both."""
    vals = table  # any indexable of KM_NUM floats (a list in the plugin, a numpy row in the simulator)
    if d_s == math.inf:
        return vals[KM_NUM - 1]  # type: ignore[index]
    if d_s <= 0.0:
        return vals[0]  # type: ignore[index]
    if d_s < KM_T0_S:
        return vals[0] + (vals[1] - vals[0]) * (d_s / KM_T0_S)  # type: ignore[index]
    if d_s >= KM_GRID_S[KM_NUM - 1]:
        return vals[KM_NUM - 1]  # type: ignore[index]
    # the segment [grid[i], grid[i + 1]) holding d_s: a guess from the logarithm, settled on the grid
    i = min(max(int(math.log(d_s / KM_T0_S) / math.log(KM_RATIO)) + 1, 1), KM_NUM - 2)
    while i > 1 and d_s < KM_GRID_S[i]:
        i -= 1
    while i < KM_NUM - 2 and d_s >= KM_GRID_S[i + 1]:
        i += 1
    lo = KM_GRID_S[i]
    frac = (d_s - lo) / (KM_GRID_S[i + 1] - lo)
    return vals[i] + (vals[i + 1] - vals[i]) * frac  # type: ignore[index]


def exp_cdf(p: float, rate_per_s: float, d_s: float) -> float:
    """F(d_s) = p (1 - exp(-rate d_s)) of the exponential model (d_s = inf allowed)."""
    if d_s == math.inf:
        return p if rate_per_s > 0.0 else 0.0
    return p * -math.expm1(-rate_per_s * d_s)


def exp_terms(p: float, rate_per_s: float, life_s: float, use_life: bool) -> tuple[float, float]:
    """The exponential model's terms that do not depend on t: (log p_w, log(1 - exp(-lambda_w life))),
    the second 0.0 without the window; (-inf, 0.0) when the block is never reused. A caller that keeps them
    per category (the simulator) computes each priority with one multiply (exp_log_reuse_prob)."""
    if p <= 0.0 or rate_per_s <= 0.0:
        return -math.inf, 0.0
    log_w = 0.0
    if use_life:
        w = -math.expm1(-rate_per_s * life_s)
        if w <= 0.0:
            return -math.inf, 0.0
        log_w = math.log(w)
    return math.log(p), log_w


def exp_log_reuse_prob(log_p: float, log_w: float, p: float, rate_per_s: float, t_s: float, use_life: bool,
                       conditional: bool) -> float:
    """log ReuseProb_w(t_s, life) of the exponential model from its exp_terms (LOG_P, LOG_W)."""
    if log_p == -math.inf:
        return -math.inf
    t = max(t_s, 0.0)
    # log[p e^(-rate t) (1 - e^(-rate life))] without underflow
    out = log_p - rate_per_s * t
    if use_life:
        out += log_w
    if conditional:
        survive = 1.0 - p + p * math.exp(-rate_per_s * t)  # 1 - F(t)
        if survive <= 0.0:
            return 0.0
        out -= math.log(survive)
    return out


def log_reuse_prob(model: int, p: float, rate_per_s: float, table: object, t_s: float, life_s: float,
                   use_life: bool, conditional: bool) -> float:
    """log ReuseProb_w(t_s, life_s) of a block last accessed t_s seconds ago (-inf: never reused)."""
    if model == MODEL_EXP:
        log_p, log_w = exp_terms(p, rate_per_s, life_s, use_life)
        return exp_log_reuse_prob(log_p, log_w, p, rate_per_s, t_s, use_life, conditional)
    t = max(t_s, 0.0)
    f_t = km_cdf(table, t)
    f_end = km_cdf(table, t + life_s if use_life else math.inf)  # one call: compiled once by the simulator
    mass = f_end - f_t
    if mass <= 0.0:
        return -math.inf
    if conditional:
        survive = 1.0 - f_t
        if survive <= 0.0:
            return 0.0
        return math.log(mass) - math.log(survive)
    return math.log(mass)


def reuse_prob(p: float, rate_per_s: float, t_s: float, life_s: float, use_life: bool,
               conditional: bool) -> float:
    """ReuseProb_w(t_s, life_s) of the exponential model (a probability, for reports and tests)."""
    return math.exp(log_reuse_prob(MODEL_EXP, p, rate_per_s, None, t_s, life_s, use_life, conditional))


def evicts_before(prio_a: float, offset_a: int, last_a: float, key_a: int,
                  prio_b: float, offset_b: int, last_b: float, key_b: int, use_offset: bool) -> bool:
    """True when block a comes before block b in the total eviction order (a is evicted first)."""
    if prio_a != prio_b:
        return prio_a < prio_b
    if use_offset and offset_a != offset_b:
        return offset_a > offset_b  # -offset: the deeper block has the lower priority
    if last_a != last_b:
        return last_a < last_b
    return key_a < key_b
