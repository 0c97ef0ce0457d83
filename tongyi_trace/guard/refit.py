"""The online refit: a sliding window of sampled reuse observations per category, refitted with the
estimator of `kvtrace fit` (tongyi_trace.fit: the censored MLE of F_w(d) = p (1 - e^(-lambda d)) and
the Kaplan-Meier table), and the per-category metrics an operator reads.

Each access of a sampled block (sampling.py) at time a by a request of category w is one sample of w's
reuse time, exactly as in tongyi_trace.fit.events: at refit time T, the samples are the accesses with
T - window_s <= a < T; OBSERVED with d = next access - a when the block was accessed again by T, else
right-censored at T - a. Memory is bounded by the sampled accesses of one window.

A category with fewer than `min_samples` samples in the window keeps its parameters (at first, the
fitted file's). The life window is not refitted (it follows the capacity, see the capacity-aware fit).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tongyi_trace.wa_priority import MODEL_EXP, exp_cdf, km_cdf

if TYPE_CHECKING:
    from tongyi_trace.fit.events import Samples

HORIZONS_S = (1.0, 10.0, 60.0, 300.0)  # where observed reuse is compared with the prediction
DEFAULT_MIN_SAMPLES = 200


@dataclass(frozen=True)
class CategoryFit:
    """One category's reuse model: exponential p and rate, and the km table (F at km_grid_s())."""

    reuse_prob: float
    rate_per_s: float
    km_cdf: tuple[float, ...]

    def cdf(self, model: int, d_s: float) -> float:
        """F(D_S) under MODEL (wa_priority.MODEL_EXP or MODEL_KM)."""
        if model == MODEL_EXP:
            return exp_cdf(self.reuse_prob, self.rate_per_s, d_s)
        return float(km_cdf(self.km_cdf, d_s))


class ReuseWindow:
    """Sampled block accesses of the last WINDOW_S seconds, each linked to the block's next access."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._recs: deque[list[Any]] = deque()  # [access_s, category, next_access_s (inf), key]
        self._last: dict[int, list[Any]] = {}

    def __len__(self) -> int:
        return len(self._recs)

    def access(self, key: int, category: int, time_s: float) -> None:
        """A request of CATEGORY at TIME_S accessed the sampled block KEY (call in time order)."""
        prev = self._last.get(key)
        if prev is not None and prev[2] == math.inf:
            prev[2] = time_s
        rec = [time_s, category, math.inf, key]
        self._recs.append(rec)
        self._last[key] = rec

    def trim(self, now_s: float) -> None:
        """Forget the accesses older than the window ending at NOW_S."""
        recs, last = self._recs, self._last
        while recs and recs[0][0] < now_s - self.window_s:
            rec = recs.popleft()
            if last.get(rec[3]) is rec:
                del last[rec[3]]

    def samples(self, now_s: float) -> dict[int, Samples]:
        """Per category, the censored reuse-time samples of the window ending at NOW_S."""
        from tongyi_trace.fit.events import Samples

        self.trim(now_s)
        if not self._recs:
            return {}
        arr = np.array([r[:3] for r in self._recs], np.float64)
        a, cat, nxt = arr[:, 0], arr[:, 1].astype(np.int64), arr[:, 2]
        keep = a < now_s
        a, cat, nxt = a[keep], cat[keep], nxt[keep]
        observed = nxt <= now_s
        t = np.where(observed, nxt - a, now_s - a)
        out = {}
        for c in np.unique(cat):
            m = cat == c
            out[int(c)] = Samples(t[m], observed[m], np.ones(int(m.sum()), np.int64))
        return out


def refit(samples: dict[int, Samples], min_samples: int = DEFAULT_MIN_SAMPLES) -> dict[int, CategoryFit]:
    """The estimator of `kvtrace fit` on each category of SAMPLES with at least MIN_SAMPLES samples."""
    from tongyi_trace.fit.policy_fit import km_table
    from tongyi_trace.fit.reuse_model import fit_reuse

    out = {}
    for c, s in samples.items():
        if s.num_samples >= min_samples:
            f = fit_reuse(s)
            out[c] = CategoryFit(f.reuse_prob, f.rate_per_s, km_table(s))
    return out


def category_metrics(samples: Samples, fit: CategoryFit, model: int) -> dict[str, float]:
    """Observed reuse (Kaplan-Meier CDF of SAMPLES) vs predicted (FIT under MODEL) at HORIZONS_S, and the
    KS distance of the window to the exponential fit (as `kvtrace fit` reports it)."""
    from tongyi_trace.fit.reuse_model import km_curve, ks_distance

    observed = km_curve(samples, np.asarray(HORIZONS_S))
    out: dict[str, float] = {"num_samples": float(samples.num_samples),
                             "ks": ks_distance(samples, fit.reuse_prob, fit.rate_per_s)}
    for h, o in zip(HORIZONS_S, observed, strict=True):
        out[f"observed_cdf_{h:g}s"] = float(o)
        out[f"predicted_cdf_{h:g}s"] = fit.cdf(model, h)
    return out
