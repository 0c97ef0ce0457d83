"""Maximum-likelihood fit of the defective exponential reuse-time CDF, with right-censoring.

Model (paper section 3, "Reuse time", Fig 14-15): after an access by a request of category w, the block
is accessed again within d seconds with probability F_w(d) = p (1 - exp(-lambda d)): with probability p
it is reused at all, after an exponential delay of rate lambda.

Likelihood of weighted samples: an observed reuse after d seconds contributes log(p lambda exp(-lambda d)),
an access censored at c (no next access by the window end) contributes log(1 - F(c)) =
log(1 - p + p exp(-lambda c)). Closed forms: no observed reuse -> p = 0 (lambda is then meaningless and
set to 0); nothing censored -> p = 1, lambda = n_obs / sum(d) (the plain exponential MLE). Otherwise
scipy's trust-region Newton (trust-exact) on (logit p, log lambda) with the analytic gradient and
Hessian, started from the censoring-naive estimate.

Goodness of fit: the Kolmogorov-Smirnov distance sup_d |F(d) - F_KM(d)| against the Kaplan-Meier
estimate of the CDF (the empirical CDF when nothing is censored), over d up to the largest sample time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tongyi_trace.policy.wa_priority import km_grid_s

# Bounds of lambda (1/s): reuses at the same timestamp (d = 0) would otherwise drive it to infinity.
MIN_RATE_PER_S = 1e-9
MAX_RATE_PER_S = 1e4
_LOG_RATE_MIN, _LOG_RATE_MAX = math.log(MIN_RATE_PER_S), math.log(MAX_RATE_PER_S)
_MAX_LOGIT = 40.0  # p within 4e-18 of 0 or 1


@dataclass(frozen=True)
class Samples:
    """Weighted reuse-time samples of one category: times, observed flags, count of each."""

    time_s: np.ndarray  # float64: reuse time d when observed, censoring time c otherwise
    observed: np.ndarray  # bool
    count: np.ndarray  # int64, >= 1

    @property
    def num_samples(self) -> int:
        """Number of accesses (observed + censored)."""
        return int(self.count.sum())

    @property
    def num_observed(self) -> int:
        """Number of accesses whose next access falls inside the window."""
        return int(self.count[self.observed].sum())

    @staticmethod
    def concat(parts: list[Samples]) -> Samples:
        """Pool several categories' samples."""
        if not parts:
            return Samples(np.empty(0), np.empty(0, dtype=bool), np.empty(0, dtype=np.int64))
        return Samples(np.concatenate([p.time_s for p in parts]),
                       np.concatenate([p.observed for p in parts]),
                       np.concatenate([p.count for p in parts]))


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


class _Objective:
    """-loglik / n of (u, v) = (logit p, log lambda) with its gradient and Hessian, cached per point.

    With S = 1 - p + p e, e = exp(-lambda c), a = 1 - e, per censored weight w:
    l_p = n_obs/p - sum w a/S,           l_lam = n_obs/lambda - sum_d - sum w p c e/S,
    l_pp = -n_obs/p^2 - sum w a^2/S^2,   l_lamlam = -n_obs/lambda^2 + sum w p (1-p) c^2 e/S^2,
    l_plam = -sum w c e/S^2."""

    def __init__(self, n_obs: float, sum_d: float, c: np.ndarray, w: np.ndarray, n_total: float) -> None:
        self.n_obs, self.sum_d, self.c, self.w, self.n = n_obs, sum_d, c, w, n_total
        self._at: tuple[float, float] | None = None
        self._val: tuple[float, np.ndarray, np.ndarray] = (0.0, np.zeros(2), np.zeros((2, 2)))

    def _eval(self, x: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        u = float(np.clip(x[0], -_MAX_LOGIT, _MAX_LOGIT))
        v = float(np.clip(x[1], _LOG_RATE_MIN, _LOG_RATE_MAX))
        if self._at == (u, v):
            return self._val
        from scipy.special import expit  # scipy is imported on first use: it slows every CLI start-up

        p, q = float(expit(u)), float(expit(-u))  # q = 1 - p without cancellation
        rate = math.exp(v)
        c, w, n_obs = self.c, self.w, self.n_obs
        e = np.exp(-rate * c)
        s = np.maximum(q + p * e, 1e-300)
        a = -np.expm1(-rate * c)
        ll = n_obs * (math.log(p) + v) - rate * self.sum_d + float(np.sum(w * np.log(s)))
        w_s = w / s
        w_s2 = w_s / s
        l_p = n_obs / p - float(np.sum(w_s * a))
        l_r = n_obs / rate - self.sum_d - p * float(np.sum(w_s * c * e))
        l_pp = -n_obs / p**2 - float(np.sum(w_s2 * a * a))
        l_rr = -n_obs / rate**2 + p * q * float(np.sum(w_s2 * c * c * e))
        l_pr = -float(np.sum(w_s2 * c * e))
        dp = p * q
        grad = np.array([l_p * dp, l_r * rate])
        hess = np.array([[l_pp * dp * dp + l_p * dp * (q - p), l_pr * dp * rate],
                         [l_pr * dp * rate, l_rr * rate * rate + l_r * rate]])
        self._at = (u, v)
        self._val = (-ll / self.n, -grad / self.n, -hess / self.n)
        return self._val

    def fun(self, x: np.ndarray) -> float:
        return self._eval(x)[0]

    def jac(self, x: np.ndarray) -> np.ndarray:
        return self._eval(x)[1]

    def hess(self, x: np.ndarray) -> np.ndarray:
        return self._eval(x)[2]


def fit_reuse(samples: Samples) -> ReuseFit:
    """Maximum-likelihood p and lambda of SAMPLES (right-censored), and the KS distance of the fit."""
    n_total = samples.num_samples
    obs = samples.observed
    n_obs = float(samples.count[obs].sum())
    sum_d = float(np.sum(samples.time_s[obs] * samples.count[obs]))
    cens_t = samples.time_s[~obs]
    cens_w = samples.count[~obs].astype(np.float64)
    if n_total == 0 or n_obs == 0:
        p, rate = 0.0, 0.0
    elif cens_w.sum() == 0:
        p, rate = 1.0, float(np.clip(n_obs / max(sum_d, 1e-300), MIN_RATE_PER_S, MAX_RATE_PER_S))
    else:
        p0 = min(max(n_obs / n_total, 1e-6), 1.0 - 1e-6)
        rate0 = float(np.clip(n_obs / max(sum_d, 1e-300), MIN_RATE_PER_S, MAX_RATE_PER_S))
        from scipy.optimize import minimize  # imported on first use: it slows every CLI start-up
        from scipy.special import expit

        obj = _Objective(n_obs, sum_d, cens_t, cens_w, float(n_total))
        res = minimize(obj.fun, np.array([math.log(p0 / (1 - p0)), math.log(rate0)]), jac=obj.jac,
                       hess=obj.hess, method="trust-exact", options={"gtol": 1e-10, "maxiter": 200})
        p = float(expit(np.clip(res.x[0], -_MAX_LOGIT, _MAX_LOGIT)))
        rate = math.exp(float(np.clip(res.x[1], _LOG_RATE_MIN, _LOG_RATE_MAX)))
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


def km_table(samples: Samples) -> tuple[float, ...]:
    """The Kaplan-Meier CDF of SAMPLES at wa_priority.km_grid_s(), held flat past the largest sample."""
    grid = np.asarray(km_grid_s())
    if samples.num_samples == 0:
        return tuple(0.0 for _ in grid)
    vals = km_curve(samples, grid)
    known = np.flatnonzero(~np.isnan(vals))
    last = float(vals[known[-1]]) if known.size else 0.0
    vals = np.where(np.isnan(vals), last, vals)
    return tuple(float(v) for v in np.clip(np.maximum.accumulate(vals), 0.0, 1.0))
