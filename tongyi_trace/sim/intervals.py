"""The intervals of one simulation sweep (`kvtrace simulate`, the report's Recommendation): every
policy-vs-LRU gain, every QTTFT change against LRU, and the cache size that reaches 80/90/95% of the
ideal hit ratio, each with its interval from the paired block bootstrap of tongyi_trace.sim.bootstrap.

- Gains: each row's hit ratio minus LRU's at the same capacity, in points, from the two rows' per-request
  hits on the same resamples (`gain_vs_lru_pp`, `gain_vs_lru_lo_pp`, `gain_vs_lru_hi_pp`; LRU's own row
  is exactly 0).
- QTTFT: the row's mean QTTFT over LRU's minus 1, in percent, from the per-request QTTFT of the cost
  model's queue (`qttft_change_pct`, `_lo_pct`, `_hi_pct`; only with a cost model). The queue is not
  re-run per resample: each request keeps the QTTFT it had, so this is the change's sampling noise.
- Sizes: LRU's, from its exact curve (every reference's stack distance, sim/lru_curve.py) read at
  NUM_CURVE_POINTS capacities spaced evenly in log, interpolated between them, per resample against that
  resample's own ideal hit ratio; the best deployable policy's as the smallest swept capacity that
  reaches the target, per resample (a range of the sweep's capacities).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tongyi_trace.sim.bootstrap import (
    DEFAULT_CONFIDENCE,
    Resampler,
    ideal_hits_per_request,
    size_reaching,
    stream_resampler,
)
from tongyi_trace.sim.lru_curve import LruCurve
from tongyi_trace.sim.recommend import NOT_DEPLOYABLE, TARGETS
from tongyi_trace.sim.stream import Stream

NUM_CURVE_POINTS = 128
HITS = "_req_hit_blocks"  # the per-request arrays a sweep's worker attaches to its row (popped before writing)
QTTFT = "_req_qttft_s"


def sweep_intervals(stream: Stream, sessions: np.ndarray, rows: Sequence[dict[str, Any]],
                    per_request: Mapping[tuple[str, str], dict[str, np.ndarray]], curve: LruCurve,
                    confidence: float = DEFAULT_CONFIDENCE) -> dict[str, Any]:
    """Add each row's gain and QTTFT change against LRU with their intervals to ROWS (in place), from
    PER_REQUEST[(policy, capacity)] = {HITS: hits per request, QTTFT: seconds per request or absent};
    return the run-level part: how the intervals were made and the sizes per target."""
    t0 = time.perf_counter()
    res, grouping = stream_resampler(stream, sessions, confidence)
    refs = np.diff(stream.req_off).astype(np.float64)
    for cap in dict.fromkeys(r["capacity"] for r in rows):  # one matrix product per capacity
        lru = per_request.get(("lru", cap))
        here = [r for r in rows if r["capacity"] == cap and (r["policy"], cap) in per_request]
        if lru is None or not here:
            continue
        mine = [per_request[(r["policy"], cap)] for r in here]
        for r, g in zip(here, res.ratio_gains([m[HITS] for m in mine], lru[HITS], refs), strict=True):
            r.update(gain_vs_lru_pp=g.point, gain_vs_lru_lo_pp=g.lo, gain_vs_lru_hi_pp=g.hi,
                     gain_significant=g.significant)
        timed = [(r, m[QTTFT]) for r, m in zip(here, mine, strict=True) if m.get(QTTFT) is not None]
        if timed and lru.get(QTTFT) is not None:
            for (r, _), q in zip(timed, res.mean_changes([v for _, v in timed], lru[QTTFT]), strict=True):
                r.update(qttft_change_pct=q.point, qttft_change_lo_pct=q.lo, qttft_change_hi_pct=q.hi)
    ideal = ideal_hits_per_request(stream.req_off, stream.blk).astype(np.float64)
    return {"confidence": res.confidence, "resampled": grouping, "num_groups": res.num_groups,
            "num_resamples": res.num_resamples,
            "targets": _target_sizes(res, stream, refs, ideal, curve, rows, per_request),
            "elapsed_s": time.perf_counter() - t0}


def _target_sizes(res: Resampler, stream: Stream, refs: np.ndarray, ideal: np.ndarray, curve: LruCurve,
                  rows: Sequence[dict[str, Any]], per_request: Mapping[tuple[str, str], dict[str, np.ndarray]],
                  ) -> list[dict[str, Any]]:
    ref_b, ideal_b = res.totals(refs), res.totals(ideal)
    ideal_ratio_b = np.divide(ideal_b, ref_b, out=np.zeros_like(ideal_b), where=ref_b > 0)
    total_refs = float(refs.sum())
    lru_grid, lru_b, lru_all = _lru_at_grid(res, stream, curve, ref_b, total_refs)
    caps, best_b, best_all = _best_at_caps(res, refs, rows, per_request, total_refs)
    out = []
    for t in TARGETS:
        need = t * float(ideal.sum()) / total_refs if total_refs else 0.0
        point = float(size_reaching(lru_grid, lru_all, need)[0])
        lru = res.interval(point, size_reaching(lru_grid, lru_b, t * ideal_ratio_b))
        entry: dict[str, Any] = {"target": t, "lru_capacity_blocks": _finite(lru.to_json())}
        if caps:
            at = _first_reaching(best_all, np.array([need]))[0]
            idx = _first_reaching(best_b, t * ideal_ratio_b)
            lo_i, hi_i = np.quantile(idx, [(1 - res.confidence) / 2, (1 + res.confidence) / 2], method="inverted_cdf")
            label = [c for _, c in caps]
            entry["best_capacity"] = {"point": label[at] if at < len(caps) else None,
                                      "lo": label[int(lo_i)] if lo_i < len(caps) else None,
                                      "hi": label[int(hi_i)] if hi_i < len(caps) else None}
        out.append(entry)
    return out


def _finite(doc: dict[str, float]) -> dict[str, float | None]:
    """Interval JSON with inf ("never reached") as None."""
    return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in doc.items()}


def _lru_at_grid(res: Resampler, stream: Stream, curve: LruCurve, ref_b: np.ndarray, total_refs: float,
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(capacity grid, LRU's hit ratio there per resample [B, K], and on the whole stream [1, K])."""
    grid = np.unique(np.round(np.geomspace(1, max(stream.num_ids, 1), NUM_CURVE_POINTS))).astype(np.int64)
    k = grid.size
    ref_group = np.repeat(res.group, np.diff(stream.req_off))
    k0 = np.searchsorted(grid, curve.ref_dist, side="left")  # a reference hits at grid[j] for every j >= k0
    first = np.bincount(ref_group * (k + 1) + k0, minlength=res.num_groups * (k + 1))
    hits_gk = np.cumsum(first.reshape(res.num_groups, k + 1), axis=1)[:, :k].astype(np.float64)
    safe = np.where(ref_b > 0, ref_b, 1.0)[:, None]
    return grid, (res.weights @ hits_gk) / safe, hits_gk.sum(axis=0, keepdims=True) / max(total_refs, 1.0)


def _best_at_caps(res: Resampler, refs: np.ndarray, rows: Sequence[dict[str, Any]],
                  per_request: Mapping[tuple[str, str], dict[str, np.ndarray]], total_refs: float,
                  ) -> tuple[list[tuple[int, str]], np.ndarray, np.ndarray]:
    """(swept capacities (blocks, label) ascending, the best deployable row's hit ratio there per resample
    [B, K] and on the whole stream [1, K]): the row with the highest hit ratio at each capacity."""
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["policy"] in NOT_DEPLOYABLE or (r["policy"], r["capacity"]) not in per_request:
            continue
        if r["capacity"] not in best or r["hit_ratio"] > best[r["capacity"]]["hit_ratio"]:
            best[r["capacity"]] = r
    caps = sorted((int(r["capacity_blocks"]), c) for c, r in best.items())
    if not caps:
        return [], np.zeros((res.num_resamples, 0)), np.zeros((1, 0))
    per_b = np.stack([res.ratio(per_request[(best[c]["policy"], c)][HITS], refs) for _, c in caps], axis=1)
    whole = np.array([[float(per_request[(best[c]["policy"], c)][HITS].sum()) / max(total_refs, 1.0)
                       for _, c in caps]])
    return caps, per_b, whole


def _first_reaching(hit: np.ndarray, need: np.ndarray) -> np.ndarray:
    """int64[B]: the first column of HIT [B, K] reaching NEED [B]; K where none does."""
    ok = hit >= need.reshape(-1, 1) - 1e-12
    return np.where(ok.any(axis=1), ok.argmax(axis=1), hit.shape[1])

