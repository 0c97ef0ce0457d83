"""Confidence intervals by a paired block bootstrap over whole sessions: the one implementation that fit,
simulate and the report use for every "how sure are we" figure.

A trace's requests are not independent: the turns of a conversation reuse each other's blocks, so a hit
ratio's noise comes from which sessions happened to arrive, not from single requests. A resample draws
whole groups with replacement: the sessions of requests.parquet (`session_id`), or, for a trace without
sessions (every request its own session, e.g. Mooncake), NUM_TIME_SLICES consecutive time slices. More
than MAX_GROUPS sessions are merged into MAX_GROUPS clusters by a seeded random assignment (a cluster of
independent sessions is still a valid resampling unit; it keeps the work bounded).

Vectorised: a resample is a weight vector over the groups (how often each group was drawn), all of
them one matrix W (resamples x groups). A per-request figure (hits, references, QTTFT seconds) is summed
per group once, and W @ sums gives its total in every resample; a hit ratio is weighted hits over
weighted references. Paired: two policies are scored on the same resample (the same W), so a gain's
interval holds only the noise of the difference, and a policy against itself is exactly [0, 0].

What it does not capture: the cache is not re-simulated per resample (each request keeps the hits it
had in the one simulation), so the interval is the workload's sampling noise given the cache's
behaviour: "would this gain hold on another hour of the same traffic".
Percentile intervals (Efron and Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13); blocks of
dependent data (Kunsch, "The jackknife and the bootstrap for general stationary observations", 1989).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tongyi_trace.errors import UsageError
from tongyi_trace.sim.stream import Stream

DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 1000
MAX_GROUPS = 4096
NUM_TIME_SLICES = 50
SEED = 20250705


def check_confidence(confidence: float, option: str = "--confidence") -> float:
    """CONFIDENCE when it is a level strictly between 0 and 1; a UsageError naming OPTION otherwise."""
    if not (isinstance(confidence, int | float) and math.isfinite(confidence) and 0.0 < confidence < 1.0):
        raise UsageError(f"{option} {confidence}: give a confidence level strictly between 0 and 1 (e.g. 0.95)")
    return float(confidence)


@dataclass(frozen=True)
class Interval:
    """A point estimate and its two-sided percentile interval at CONFIDENCE (same unit as the point)."""

    point: float
    lo: float
    hi: float
    confidence: float

    @property
    def significant(self) -> bool:
        """The interval lies above 0 (a gain that noise does not explain)."""
        return self.lo > 0.0

    @property
    def half_width(self) -> float:
        """Half the interval's width: the '+-' of `text`."""
        return (self.hi - self.lo) / 2.0

    def text(self, spec: str = "+.2f") -> str:
        """'+0.05 +- 0.31' (SPEC formats both numbers; the sign only on the point)."""
        return f"{format(self.point, spec)} +- {format(self.half_width, spec.lstrip('+'))}"

    def to_json(self) -> dict[str, float]:
        """{point, lo, hi, confidence}."""
        return {"point": self.point, "lo": self.lo, "hi": self.hi, "confidence": self.confidence}


def significant_best(gains: Mapping[str, Interval]) -> str | None:
    """The name whose gain is significant with the highest lower bound (ties: the first), None when no
    gain is significant: the one rule by which `kvtrace fit` chooses a setting and the recommendation a
    policy over LRU."""
    named = [(name, g) for name, g in gains.items() if g.significant]
    return max(named, key=lambda item: item[1].lo)[0] if named else None


def request_groups(session_id: np.ndarray | None, time_s: np.ndarray,
                   num_slices: int = NUM_TIME_SLICES) -> np.ndarray:
    """int64[N]: the resampling group of each request, 0..G-1: its session (SESSION_ID) when the trace has
    sessions (fewer distinct sessions than requests), else its slice of NUM_SLICES equal consecutive time
    slices of TIME_S (empty slices dropped, groups renumbered densely)."""
    n = int(time_s.shape[0])
    if session_id is not None and n and np.unique(session_id).size < n:
        return np.unique(np.asarray(session_id), return_inverse=True)[1].astype(np.int64).reshape(-1)
    if n == 0:
        return np.zeros(0, np.int64)
    t = np.asarray(time_s, np.float64)
    span = float(t.max() - t.min())
    if span <= 0:  # one instant: slices of consecutive requests in order
        raw = (np.arange(n) * num_slices) // n
    else:
        raw = np.minimum(((t - t.min()) / span * num_slices).astype(np.int64), num_slices - 1)
    return np.unique(raw, return_inverse=True)[1].astype(np.int64).reshape(-1)


@dataclass(frozen=True)
class Resampler:
    """NUM_RESAMPLES bootstrap resamples of the groups of N requests, as the weight matrix `weights`
    (resamples x groups: how often each group was drawn)."""

    group: np.ndarray  # int64[N]: each request's group 0..G-1
    weights: np.ndarray  # float64[B, G]
    confidence: float

    @property
    def num_groups(self) -> int:
        """G: the resampling units (sessions, slices or clusters of sessions)."""
        return int(self.weights.shape[1])

    @property
    def num_resamples(self) -> int:
        """B."""
        return int(self.weights.shape[0])

    def group_sums(self, per_request: np.ndarray) -> np.ndarray:
        """float64[G] (or [G, K] for an [N, K] input): PER_REQUEST summed over each group."""
        x = np.asarray(per_request, np.float64)
        if x.ndim == 1:
            return np.bincount(self.group, weights=x, minlength=self.num_groups)
        out = np.zeros((self.num_groups, x.shape[1]))
        np.add.at(out, self.group, x)
        return out

    def totals(self, per_request: np.ndarray) -> np.ndarray:
        """float64[B] (or [B, K]): PER_REQUEST's total in every resample."""
        return self.weights @ self.group_sums(per_request)

    def ratio(self, num: np.ndarray, den: np.ndarray) -> np.ndarray:
        """float64[B]: sum(NUM) / sum(DEN) in every resample (0 where the denominator is 0)."""
        n, d = self.totals(num), self.totals(den)
        return np.divide(n, d, out=np.zeros_like(n), where=d > 0)

    def interval(self, point: float, samples: np.ndarray) -> Interval:
        """POINT with the percentile interval of SAMPLES (NaN and inf resamples count at their end)."""
        return self.intervals(np.array([point]), np.asarray(samples, np.float64).reshape(-1, 1))[0]

    def intervals(self, points: np.ndarray, samples: np.ndarray) -> list[Interval]:
        """POINTS[k] with the percentile interval of column k of SAMPLES [B, K]."""
        a = (1.0 - self.confidence) / 2.0
        if samples.shape[0] == 0:
            return [Interval(float(p), math.nan, math.nan, self.confidence) for p in points]
        lo, hi = np.quantile(np.nan_to_num(samples, nan=math.inf), [a, 1.0 - a], axis=0, method="inverted_cdf")
        return [Interval(float(p), float(x), float(y), self.confidence) for p, x, y in zip(points, lo, hi, strict=True)]

    def ratio_gain(self, hits_a: np.ndarray, hits_b: np.ndarray, refs: np.ndarray, scale: float = 100.0) -> Interval:
        """Paired interval of A's hit ratio minus B's (per-request hits over per-request references), in
        SCALE units (100: points)."""
        return self.ratio_gains([hits_a], hits_b, refs, scale)[0]

    def ratio_gains(self, hits: list[np.ndarray], base: np.ndarray, refs: np.ndarray, scale: float = 100.0,
                    ) -> list[Interval]:
        """ratio_gain of each of HITS over BASE, in one matrix product."""
        if not hits:
            return []
        diff = np.stack([self.group_sums(np.asarray(h, np.float64) - base) for h in hits], axis=1)  # [G, K]
        den = self.totals(refs)
        safe = np.where(den > 0, den, 1.0)[:, None]
        total = float(np.sum(refs))
        points = scale * diff.sum(axis=0) / total if total > 0 else np.zeros(len(hits))
        return self.intervals(points, scale * (self.weights @ diff) / safe * (den > 0)[:, None])

    def mean_change(self, values_a: np.ndarray, values_b: np.ndarray, scale: float = 100.0) -> Interval:
        """Paired interval of mean(A) / mean(B) - 1 over the requests (per-request values, e.g. QTTFT
        seconds), in SCALE units (100: percent); NaN when B's mean is 0."""
        return self.mean_changes([values_a], values_b, scale)[0]

    def mean_changes(self, values: list[np.ndarray], base: np.ndarray, scale: float = 100.0) -> list[Interval]:
        """mean_change of each of VALUES over BASE, in one matrix product."""
        if not values:
            return []
        sums = np.stack([self.group_sums(v) for v in [*values, base]], axis=1)  # [G, K + 1]: base last, so
        whole = sums.sum(axis=0)  # both sides of every ratio are summed alike (a policy against itself: 0)
        points = scale * (whole[:-1] / whole[-1] - 1.0) if whole[-1] > 0 else np.full(len(values), math.nan)
        t = self.weights @ sums
        tb = t[:, -1:]
        rel = np.divide(t[:, :-1], tb, out=np.full((tb.shape[0], len(values)), math.nan), where=tb > 0)
        return self.intervals(points, scale * (rel - 1.0))


def make_resampler(group: np.ndarray, *, confidence: float = DEFAULT_CONFIDENCE,
                   num_resamples: int = DEFAULT_RESAMPLES, max_groups: int = MAX_GROUPS,
                   seed: int = SEED) -> Resampler:
    """NUM_RESAMPLES resamples of the groups GROUP (int64[N], 0..G-1) with replacement, seeded (the same
    inputs give the same intervals); more than MAX_GROUPS groups are first merged into MAX_GROUPS random
    clusters."""
    check_confidence(confidence)
    rng = np.random.default_rng(seed)
    g = np.asarray(group, np.int64)
    num = int(g.max()) + 1 if g.size else 0
    if num > max_groups:
        cluster = rng.permutation(num) % max_groups
        g, num = cluster[g], max_groups
    if num == 0:
        return Resampler(g, np.zeros((num_resamples, 0)), confidence)
    draws = rng.integers(0, num, size=(num_resamples, num)) + np.arange(num_resamples)[:, None] * num
    weights = np.bincount(draws.reshape(-1), minlength=num_resamples * num).reshape(num_resamples, num)
    return Resampler(g, weights.astype(np.float64), confidence)


def stream_resampler(stream: Stream, sessions: np.ndarray, confidence: float = DEFAULT_CONFIDENCE
                     ) -> tuple[Resampler, str]:
    """The resampler of STREAM's requests grouped by their run's SESSIONS (session_id per req_idx), else
    by time slices; and which ("sessions" or "time slices")."""
    sess = np.asarray(sessions)[stream.req_idx]
    grouping = "sessions" if np.unique(sess).size < sess.size else "time slices"
    return make_resampler(request_groups(sess, stream.req_time_s), confidence=confidence), grouping


def ideal_hits_per_request(req_off: np.ndarray, blk: np.ndarray) -> np.ndarray:
    """int64[N]: each request's hits with an unlimited cache (its references minus the first references of
    an id); their sum is Stream.ideal_hits()."""
    n = int(req_off.shape[0] - 1)
    refs = np.diff(req_off)
    if blk.size == 0:
        return np.zeros(n, np.int64)
    _, first = np.unique(blk, return_index=True)
    req_of_ref = np.repeat(np.arange(n), refs)
    return (refs - np.bincount(req_of_ref[first], minlength=n)).astype(np.int64)


def size_reaching(caps: np.ndarray, hit_ratio: np.ndarray, need: np.ndarray | float) -> np.ndarray:
    """The smallest capacity at which HIT_RATIO (rising over CAPS, [..., K]) reaches NEED ([...]),
    interpolated linearly between the grid points around it; inf where it never does."""
    h = np.atleast_2d(np.asarray(hit_ratio, np.float64))
    want = np.broadcast_to(np.asarray(need, np.float64), h.shape[:1]).reshape(-1, 1)
    c = np.asarray(caps, np.float64)
    ok = h >= want
    reached = ok.any(axis=1)
    j = ok.argmax(axis=1)
    j0 = np.maximum(j - 1, 0)
    rows = np.arange(h.shape[0])
    h0, h1 = h[rows, j0], h[rows, j]
    rise = h1 - h0
    frac = np.divide(want[:, 0] - h0, rise, out=np.ones_like(h0), where=rise > 0)
    size = c[j0] + np.clip(frac, 0.0, 1.0) * (c[j] - c[j0])
    return np.where(reached, size, math.inf)
