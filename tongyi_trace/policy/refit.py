"""The online refit: a sliding window of sampled reuse observations per category, refitted with the
estimator of `kvtrace fit` (tongyi_trace.fit: the censored MLE of F_w(d) = p (1 - e^(-lambda d)) and
the Kaplan-Meier table), and the per-category metrics an operator reads.

Each access of a sampled block (sampling.py) at time a by a request of category w is one sample of w's
reuse time, exactly as in tongyi_trace.fit.events: at refit time T, the samples are the accesses with
T - window_s <= a < T; OBSERVED with d = next access - a when the block was accessed again by T, else
right-censored at T - a. Memory is bounded by the sampled accesses of one window. The blocks are those of
`sample_rate`, not the larger sample the shadows of a small cache take (sampling.shadow_rate; the lower
rate's sample is a subset of it), so the refit's cost does not grow as the cache shrinks.

A category is refitted only when its current model is stale: the window's KS distance to it (see
category_metrics) exceeds KS_STALE / sqrt(samples). The blocks of one request share their reuse, so the
samples are far from independent and the test's 5% value (1.36) rejects even a good fit: KS_STALE is
calibrated on the to-C bench (bench/bench_guard.py), where the fitted file scores a median of 2.4 on
windows of its own trace and 5 to 6.5 after the shift; of 4, 6 and 8, 6 lost least on the unshifted
trace and recovered most after the shift. A window holds 1/R fewer samples than the fitted file, so a
refit from it is noisier: refitting a model the data do not reject would only add noise. A category
with fewer than `min_samples` samples in the window keeps its parameters (at first, the fitted file's).
The life window is not refitted (it follows the capacity, see the capacity-aware fit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tongyi_trace.policy.wa_priority import MODEL_EXP, exp_cdf, km_cdf

if TYPE_CHECKING:
    from tongyi_trace.policy.reuse_model import Samples

HORIZONS_S = (1.0, 10.0, 60.0, 300.0)  # where observed reuse is compared with the prediction
DEFAULT_MIN_SAMPLES = 200
KS_STALE = 6.0  # sqrt(n) x the KS distance beyond which a model is stale (see the module doc)


@dataclass
class RefitClock:
    """When the online refit runs, one schedule for the simulator (sim/guarded.py) and the engine
    (vllm_plugin/guard.py): every REFIT_S seconds of the policy clock from the first request (NEXT_S: the
    first due time, None = REFIT_S after the first time asked); a check past several due times refits once
    and moves to the first due time after it."""

    refit_s: float
    next_s: float | None = None

    def due(self, time_s: float) -> bool:
        """Whether a refit is due at TIME_S (then the next due time moves past it)."""
        if self.next_s is None:
            self.next_s = time_s + self.refit_s
        if time_s < self.next_s:
            return False
        self.next_s += self.refit_s * (int((time_s - self.next_s) // self.refit_s) + 1)
        return True


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
    """Sampled block accesses of the last WINDOW_S seconds, each linked to the block's next access
    (columns in numpy buffers; a dict from block key to its latest access)."""

    def __init__(self, window_s: float, num_keys: int | None = None) -> None:
        self.window_s = window_s
        # dense keys 0..num_keys-1 (the simulator): the latest access per key in an array, else a dict
        self._last_arr = np.full(num_keys, -1, np.int64) if num_keys is not None else None
        self._t = np.empty(1024)
        self._cat = np.empty(1024, np.int64)
        self._next = np.empty(1024)
        self._lo = 0  # first live row
        self._hi = 0  # one past the last row
        self._base = 0  # absolute number of the row stored at index 0
        self._last: dict[int, int] = {}  # block key -> absolute row of its latest access

    def __len__(self) -> int:
        return self._hi - self._lo

    def add(self, keys: np.ndarray, categories: np.ndarray, times_s: np.ndarray) -> None:
        """Accesses of the sampled blocks KEYS by requests of CATEGORIES at TIMES_S (in time order, after
        every earlier call's)."""
        n = len(keys)
        if n == 0:
            return
        self._reserve(n)
        lo, hi = self._hi, self._hi + n
        self._t[lo:hi] = times_s
        self._cat[lo:hi] = categories
        nxt = self._next[lo:hi]
        nxt[:] = math.inf
        order = np.argsort(keys, kind="stable")
        ks = keys[order]
        same = ks[1:] == ks[:-1]  # consecutive accesses of one block inside the batch
        nxt[order[:-1][same]] = np.asarray(times_s)[order[1:][same]]
        firsts = np.flatnonzero(np.concatenate([[True], ~same]))
        lasts = np.concatenate([firsts[1:], [n]]) - 1
        base, last, t_all, next_all = self._base, self._last, self._t, self._next
        row0 = base + lo
        if self._last_arr is not None:
            keys_first = ks[firsts]
            prev = self._last_arr[keys_first] - base
            ok = prev >= self._lo
            ok[ok] = next_all[prev[ok]] == math.inf
            next_all[prev[ok]] = t_all[lo + order[firsts][ok]]
            self._last_arr[keys_first] = row0 + order[lasts]
            self._hi = hi
            return
        for k, first, final in zip(ks[firsts].tolist(), order[firsts].tolist(), order[lasts].tolist(), strict=True):
            prev = last.get(k)
            if prev is not None and prev - base >= self._lo and next_all[prev - base] == math.inf:
                next_all[prev - base] = t_all[lo + first]
            last[k] = row0 + final
        self._hi = hi

    def _reserve(self, n: int) -> None:
        if self._hi + n <= len(self._t):
            return
        live = slice(self._lo, self._hi)
        size = max(2 * (self._hi - self._lo + n), 1024)
        t, cat, nxt = np.empty(size), np.empty(size, np.int64), np.empty(size)
        m = self._hi - self._lo
        t[:m], cat[:m], nxt[:m] = self._t[live], self._cat[live], self._next[live]
        self._t, self._cat, self._next = t, cat, nxt
        self._base += self._lo
        self._hi, self._lo = m, 0

    def trim(self, now_s: float) -> None:
        """Forget the accesses older than the window ending at NOW_S."""
        live = self._t[self._lo:self._hi]
        self._lo += int(np.searchsorted(live, now_s - self.window_s, side="left"))
        if len(self._last) > 4 * (self._hi - self._lo) + 1024:
            floor = self._base + self._lo
            self._last = {k: r for k, r in self._last.items() if r >= floor}

    def samples(self, now_s: float) -> dict[int, Samples]:
        """Per category, the censored reuse-time samples of the window ending at NOW_S."""
        from tongyi_trace.policy.reuse_model import Samples

        self.trim(now_s)
        a, cat, nxt = (x[self._lo:self._hi] for x in (self._t, self._cat, self._next))
        keep = a < now_s
        a, cat, nxt = a[keep], cat[keep], nxt[keep]
        observed = nxt <= now_s
        t = np.where(observed, nxt - a, now_s - a)
        out = {}
        for c in np.unique(cat):
            m = cat == c
            out[int(c)] = Samples(t[m], observed[m], np.ones(int(m.sum()), np.int64))
        return out


def is_stale(metrics: dict[str, float]) -> bool:
    """Whether the window's data reject the model (metrics from category_metrics; see the module doc)."""
    n, ks = metrics["num_samples"], metrics["ks"]
    return n > 0 and ks == ks and ks > KS_STALE / math.sqrt(n)


def refit(samples: dict[int, Samples], current: dict[int, CategoryFit], model: int,
          min_samples: int = DEFAULT_MIN_SAMPLES) -> tuple[dict[int, CategoryFit], dict[int, dict[str, float]]]:
    """(new fits, metrics of the current fits) per category of SAMPLES: the estimator of `kvtrace fit`
    (the Kaplan-Meier table, and the exponential MLE when MODEL is exp; under km p and rate stay) on each
    category with at least MIN_SAMPLES samples whose CURRENT fit is stale (is_stale)."""
    from tongyi_trace.policy.reuse_model import fit_reuse, km_table

    out, metrics = {}, {}
    for c, s in samples.items():
        old = current[c]
        metrics[c] = category_metrics(s, old, model, observe=s.num_samples >= min_samples)
        if s.num_samples < min_samples or not is_stale(metrics[c]):
            continue
        if model == MODEL_EXP:
            f = fit_reuse(s)
            out[c] = CategoryFit(f.reuse_prob, f.rate_per_s, km_table(s))
        else:
            out[c] = CategoryFit(old.reuse_prob, old.rate_per_s, km_table(s))
    return out, metrics


def category_metrics(samples: Samples, fit: CategoryFit, model: int, observe: bool = True) -> dict[str, float]:
    """Observed reuse (Kaplan-Meier CDF of SAMPLES) vs predicted (FIT under MODEL) at HORIZONS_S, and the
    KS distance of the window to the model: sup |F - F_KM| as `kvtrace fit` reports it for exp, over
    the km grid (up to the longest sample) for km. Without OBSERVE (refit: a category with fewer than
    min_samples samples, which the refit does not judge) the observed CDF and the KS are NaN: a few dozen
    samples, most from the same requests, say little, and the Kaplan-Meier passes over the many small
    categories of a context-class fit were most of the refit's time."""
    from tongyi_trace.policy.reuse_model import km_curve, ks_distance
    from tongyi_trace.policy.wa_priority import km_grid_s

    if not observe:
        observed, ks = np.full(len(HORIZONS_S), math.nan), math.nan
    elif model == MODEL_EXP:
        observed = km_curve(samples, np.asarray(HORIZONS_S))
        ks = ks_distance(samples, fit.reuse_prob, fit.rate_per_s)
    else:  # one Kaplan-Meier pass for the horizons and the grid
        both = km_curve(samples, np.concatenate([HORIZONS_S, km_grid_s()]))
        observed, window_km = both[:len(HORIZONS_S)], both[len(HORIZONS_S):]
        known = ~np.isnan(window_km)
        ks = float(np.max(np.abs(np.asarray(fit.km_cdf)[known] - window_km[known]))) if known.any() else math.nan
    out: dict[str, float] = {"num_samples": float(samples.num_samples), "ks": ks}
    for h, o in zip(HORIZONS_S, observed, strict=True):
        out[f"observed_cdf_{h:g}s"] = float(o)
        out[f"predicted_cdf_{h:g}s"] = fit.cdf(model, h)
    return out
