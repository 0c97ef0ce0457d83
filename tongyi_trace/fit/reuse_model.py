"""Maximum-likelihood fit of the defective exponential reuse-time CDF, with right-censoring.

Model (paper section 3, "Reuse time", Fig 14-15): after an access by a request of category w, the block
is accessed again within d seconds with probability F_w(d) = p (1 - exp(-lambda d)): with probability p
it is reused at all, after an exponential delay of rate lambda.

Likelihood of weighted samples: an observed reuse after d seconds contributes log(p lambda exp(-lambda d)),
an access censored at c (no next access by the window end) contributes log(1 - F(c)) =
log(1 - p + p exp(-lambda c)). Closed forms: no observed reuse -> p = 0 (lambda is then meaningless and
set to 0); nothing censored -> p = 1, lambda = n_obs / sum(d) (the plain exponential MLE). Otherwise
scipy L-BFGS-B on (p, log lambda) with the analytic gradient, started from the censoring-naive estimate.

Goodness of fit: the Kolmogorov-Smirnov distance sup_d |F(d) - F_KM(d)| against the Kaplan-Meier
estimate of the CDF (the empirical CDF when nothing is censored), over d up to the largest sample time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from tongyi_trace.fit.events import Samples

# Bounds of lambda (1/s): reuses at the same timestamp (d = 0) would otherwise drive it to infinity.
MIN_RATE_PER_S = 1e-9
MAX_RATE_PER_S = 1e4
_MIN_P = 1e-12


@dataclass(frozen=True)
class ReuseFit:
    """Fitted p and lambda of one sample set, with its size and KS distance to the Kaplan-Meier CDF."""

    reuse_prob: float
    rate_per_s: float
    num_samples: int
    num_observed: int
    ks: float

    @property
    def mean_reuse_s(self) -> float:
        """1 / lambda (inf when nothing is reused)."""
        return 1.0 / self.rate_per_s if self.rate_per_s > 0 else math.inf


def model_cdf(reuse_prob: float, rate_per_s: float, d_s: np.ndarray) -> np.ndarray:
    """F(d) = p (1 - exp(-lambda d))."""
    return reuse_prob * -np.expm1(-rate_per_s * np.asarray(d_s, dtype=np.float64))


def _neg_loglik(x: np.ndarray, n_obs: float, sum_d: float, c: np.ndarray, w: np.ndarray,
                n_total: float) -> tuple[float, np.ndarray]:
    p, rate = float(x[0]), math.exp(float(x[1]))
    e = np.exp(-rate * c)
    surv = 1.0 - p + p * e  # 1 - F(c) > 0 for p < 1 or c finite
    surv = np.maximum(surv, 1e-300)
    ll = n_obs * (math.log(p) + math.log(rate)) - rate * sum_d + float(np.dot(w, np.log(surv)))
    dp = n_obs / p + float(np.dot(w, (e - 1.0) / surv))
    drate = n_obs / rate - sum_d - float(np.dot(w, p * c * e / surv))
    # minimize -ll / n (scaled so the tolerances mean the same for every sample size)
    return -ll / n_total, np.array([-dp / n_total, -drate * rate / n_total])


def fit_reuse(samples: Samples) -> ReuseFit:
    """Maximum-likelihood p and lambda of SAMPLES (right-censored), and the KS distance of the fit."""
    n_total = samples.num_samples
    obs = samples.observed
    n_obs = float(samples.count[obs].sum())
    sum_d = float(np.dot(samples.time_s[obs], samples.count[obs]))
    cens_t = samples.time_s[~obs]
    cens_w = samples.count[~obs].astype(np.float64)
    if n_total == 0 or n_obs == 0:
        p, rate = 0.0, 0.0
    elif cens_w.sum() == 0:
        p, rate = 1.0, float(np.clip(n_obs / max(sum_d, 1e-300), MIN_RATE_PER_S, MAX_RATE_PER_S))
    else:
        p0 = min(max(n_obs / n_total, 1e-6), 1.0 - 1e-6)
        rate0 = float(np.clip(n_obs / max(sum_d, 1e-300), MIN_RATE_PER_S, MAX_RATE_PER_S))
        res = minimize(_neg_loglik, np.array([p0, math.log(rate0)]), jac=True, method="L-BFGS-B",
                       args=(n_obs, sum_d, cens_t, cens_w, float(n_total)),
                       bounds=[(_MIN_P, 1.0), (math.log(MIN_RATE_PER_S), math.log(MAX_RATE_PER_S))],
                       options={"ftol": 1e-13, "gtol": 1e-9, "maxiter": 500})
        p, rate = float(res.x[0]), math.exp(float(res.x[1]))
    return ReuseFit(p, rate, n_total, int(n_obs), ks_distance(samples, p, rate))


def kaplan_meier_cdf(samples: Samples) -> tuple[np.ndarray, np.ndarray]:
    """Distinct event times t_k (sorted) and the Kaplan-Meier CDF 1 - S(t_k) right after each of them.

    Censored samples at time t count as at risk at t (events before censorings on ties)."""
    t = samples.time_s
    order = np.argsort(t, kind="stable")
    t, obs, cnt = t[order], samples.observed[order], samples.count[order].astype(np.float64)
    times, first = np.unique(t, return_index=True)
    events = np.add.reduceat(np.where(obs, cnt, 0.0), first) if len(t) else np.empty(0)
    totals = np.add.reduceat(cnt, first) if len(t) else np.empty(0)
    at_risk = totals[::-1].cumsum()[::-1]  # samples with time >= t_k
    keep = events > 0
    factors = 1.0 - events[keep] / at_risk[keep]
    survival = np.cumprod(factors)
    return times[keep], 1.0 - survival


def ks_distance(samples: Samples, reuse_prob: float, rate_per_s: float) -> float:
    """sup_d |F(d) - F_KM(d)| for d in [0, largest sample time]; NaN without samples."""
    if samples.num_samples == 0:
        return math.nan
    times, km = kaplan_meier_cdf(samples)
    t_max = float(samples.time_s.max())
    fitted = model_cdf(reuse_prob, rate_per_s, times)
    before = np.concatenate([[0.0], km[:-1]])  # F_KM just before each jump
    gaps = [np.abs(fitted - km), np.abs(fitted - before)]
    last = km[-1] if len(km) else 0.0
    gaps.append(np.abs(model_cdf(reuse_prob, rate_per_s, np.array([t_max])) - last))
    return float(max(float(g.max()) if len(g) else 0.0 for g in gaps))


def km_curve(samples: Samples, grid_s: np.ndarray) -> np.ndarray:
    """The Kaplan-Meier CDF at each point of GRID_S (NaN beyond the largest sample time)."""
    times, km = kaplan_meier_cdf(samples)
    idx = np.searchsorted(times, grid_s, side="right") - 1
    out = np.where(idx >= 0, km[np.maximum(idx, 0)] if len(km) else 0.0, 0.0)
    t_max = float(samples.time_s.max()) if samples.num_samples else -1.0
    return np.where(grid_s <= t_max, out, np.nan)
