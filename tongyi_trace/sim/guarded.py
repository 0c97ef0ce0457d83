"""WA with the guard and the online refit in the simulator: the stream is served in slices of `slice_s`
trace seconds by a sim.simulate.Cache, beside two shadow Caches (LRU, and WA with the same settings) of
R x the capacity over the hash-sampled sub-stream (policy/sampling.py; R = shadow_rate: sample_rate, raised so a
shadow holds at least MIN_SHADOW_BLOCKS). After each slice the guard
(policy/guard.py) gets both shadows' hits and may flip the cache's LRU-order switch (wa.IP_LRU_ORDER); every
`refit_s` seconds the reuse window of the sampled accesses (policy/refit.py) is refitted and the new parameters
overwrite the per-category columns of `Cache.cw` in the cache and in the WA shadow.

The guard compares the order that runs, measured exactly (the cache's own hits on the sampled
references: a hit is a prefix, so those are the sampled positions inside each request's hit prefix),
with the other order's shadow: in policy mode the cache vs the LRU shadow, in LRU mode the WA shadow vs
the cache. One of the two estimates is then free of shadow error (the shadows' hit ratios over short
windows stray by points from the full cache's at 1/32, most of all while the caches warm up).

`per_request=True` runs the engine's guard instead (the vLLM plugin's, vllm_plugin/guard.py: one step per
request at its trace time, both orders on their shadows); predict_guarded serves it through the engine
model (sim.engine_model) to predict a guarded engine's cached tokens and switches request for request.

The time line (one row per slice: the cache's hit ratio, both shadows', the guard's windowed estimates
and mode, refits) and the refit table (per refit and category: parameters before and after, observed vs
predicted reuse, KS) are returned for the artifacts RUN/sim/guard_timeline.parquet and
guard_refits.parquet.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tongyi_trace.policy.file import PolicyParams
from tongyi_trace.policy.guard import LRU, Guard, Switch
from tongyi_trace.policy.refit import CategoryFit, RefitClock, ReuseWindow, refit
from tongyi_trace.policy.sampling import sampled_mask, shadow_rate, threshold
from tongyi_trace.run import RunTables
from tongyi_trace.sim.engine_model import engine_case
from tongyi_trace.sim.kernel import S_EVICTIONS
from tongyi_trace.sim.policies.wa import CW_P, CW_RATE, CW_TABLE, IP_LRU_ORDER, IP_MODEL, WaParams
from tongyi_trace.sim.registry import FITTED
from tongyi_trace.sim.simulate import Cache, EngineShape, PolicyResult, resolve_fitted
from tongyi_trace.sim.stream import Stream, densify

DEFAULT_SLICE_S = 10.0


@dataclass
class GuardedRun:
    """The cache's result, with the guard's and the refit's record."""

    result: PolicyResult
    switches: list[Switch] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    refits: list[dict[str, Any]] = field(default_factory=list)
    time_in_mode_s: dict[str, float] = field(default_factory=dict)
    shadow_capacity_blocks: int = 0

    @property
    def guarded(self) -> bool:
        """Whether the guard or the refit ran (else the result is the plain policy's)."""
        return self.shadow_capacity_blocks > 0

    def summary(self) -> dict[str, Any]:
        """The result's row plus guard_switches, refits, the time in each mode (null when neither ran)
        and the shadow size; a guarded run also carries its tables under GUARD_TABLES (pop_guard_tables)."""
        row = {**self.result.summary(), "guard_switches": len(self.switches),
               "refits": len({r["time_s"] for r in self.refits}),
               "guard_time_policy_s": self.time_in_mode_s.get("policy") if self.guarded else None,
               "guard_time_lru_s": self.time_in_mode_s.get(LRU) if self.guarded else None,
               "shadow_capacity_blocks": self.shadow_capacity_blocks}
        if self.guarded:
            row["guard_timeline"] = self.timeline
            row["guard_refits"] = self.refits
            row["guard_switch_log"] = [dataclasses.asdict(s) for s in self.switches]
        return row


GUARD_TABLES = ("guard_timeline", "guard_refits", "guard_switch_log")


def pop_guard_tables(row: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Take a result row's guard tables out of it (they go to their own files), each line tagged with the
    row's policy and capacity."""
    tag = {"policy": row.get("policy"), "capacity": row.get("capacity")}
    return {k: [{**tag, **line} for line in row.pop(k, [])] for k in GUARD_TABLES}


def write_guard_tables(out_dir: Path, tables: list[dict[str, list[dict[str, Any]]]]) -> None:
    """OUT_DIR/guard_timeline.parquet, guard_refits.parquet and guard_switches.parquet from the rows'
    tables (files only for tables with lines)."""
    import polars as pl

    names = {"guard_timeline": "guard_timeline", "guard_refits": "guard_refits",
             "guard_switch_log": "guard_switches"}
    for key, name in names.items():
        lines = [line for t in tables for line in t.get(key, [])]
        if lines:
            pl.DataFrame(lines).write_parquet(out_dir / f"{name}.parquet")


def lru_time_share(row: dict[str, Any]) -> float | None:
    """The share of the trace a guarded ROW (a sweep row) spent in LRU order: guard_time_lru_s over the
    guarded time; None for a row without the guard. The one source of this figure (simulate's table, the
    report's guard table and guard sections)."""
    pol, lru = row.get("guard_time_policy_s"), row.get("guard_time_lru_s")
    if lru is None:
        return None
    total = float(pol or 0.0) + float(lru)
    return float(lru) / total if total > 0 else 0.0


def guard_cell(row: dict[str, Any]) -> str:
    """The guard's column of `kvtrace simulate`'s table: switches, refits and the share of time in LRU."""
    share = lru_time_share(row)
    if share is None or row.get("guard_time_policy_s") is None:
        return "-"
    return f"{row['guard_switches']} sw, {row['refits']} refits, lru {share:.0%}"


def sampled_refs(stream: Stream, rate: float) -> np.ndarray:
    """bool per reference of STREAM: whether its block is in the hash sample of RATE."""
    return sampled_mask(np.arange(stream.num_ids, dtype=np.int64), threshold(rate))[stream.blk]


def sampled_stream(stream: Stream, rate: float, keep: np.ndarray | None = None,
                   csum: np.ndarray | None = None) -> Stream:
    """STREAM with only the references to hash-sampled blocks (same requests, times and categories);
    KEEP = sampled_refs(STREAM, RATE) and CSUM = sampled_prefix_counts(KEEP) when already known."""
    keep = sampled_refs(stream, rate) if keep is None else keep
    csum = sampled_prefix_counts(keep) if csum is None else csum
    off = csum[stream.req_off]
    ntok = stream.ntok[keep]
    tok = np.concatenate([[0], np.cumsum(ntok, dtype=np.int64)])
    ids, num_ids = densify(stream.blk[keep])
    return dataclasses.replace(stream, req_off=off, blk=ids, ntok=ntok, req_tokens=tok[off[1:]] - tok[off[:-1]],
                               num_ids=num_ids)


def sampled_prefix_counts(keep: np.ndarray) -> np.ndarray:
    """int64[R+1]: how many sampled references (KEEP) precede each position of the stream."""
    return np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])


def simulate_guarded(stream: Stream, policy: str, capacity_blocks: int, *, params: dict[str, Any] | None = None,
                     fit: PolicyParams | None = None, engine: EngineShape | None = None,
                     next_req: np.ndarray | None = None, slice_s: float = DEFAULT_SLICE_S,
                     timing: bool = True, per_request: bool = False) -> GuardedRun:
    """POLICY (wa, or fitted resolving to wa) at CAPACITY_BLOCKS over STREAM with the guard and refit
    that PARAMS ask for (WaParams.guard, refit_s, ...); any other policy, or neither asked, runs plain.
    PER_REQUEST: the engine's guard (vllm_plugin/guard.py) instead of the simulator's: one step per
    request at its trace time (none for a request without sampled references), both orders measured on
    their shadows."""
    cache = Cache(stream, policy, capacity_blocks, params=params, fit=fit, engine=engine, next_req=next_req,
                  timing=timing)
    n = stream.num_requests
    wa = _wa_params(cache)
    if wa is None or not wa.active or n == 0:
        cache.serve(0, n)
        return GuardedRun(cache.result())
    rate = shadow_rate(wa.sample_rate, capacity_blocks)
    keep = sampled_refs(stream, rate)
    before = sampled_prefix_counts(keep)  # sampled references before each position
    sub = sampled_stream(stream, rate, keep, before)
    scap = max(1, round(rate * capacity_blocks))
    shadow_params = {k: v for k, v in cache.params.items() if k in {f.name for f in dataclasses.fields(WaParams)}}
    shadow_params["leaf_only"] = cache.leaf_only
    lru = Cache(sub, "lru", scap, timing=False)
    pol = Cache(sub, "wa", scap, params=shadow_params, fit=fit, timing=False)
    pol.cw = cache.cw.copy()
    for c in (cache, lru, pol):  # a machine's first run compiles the kernels: not the run's speed
        c.warm()
    t0 = time.perf_counter()  # the serving loop: the three caches, the guard and the refits (as Cache.serve)
    guard = Guard(wa.guard_margin, wa.guard_window_s) if wa.guard else None
    window = ReuseWindow(wa.window_s, sub.num_ids) if wa.refit_s > 0 else None
    # the refit reads the blocks of sample_rate only (a subset of the shadows' sample): see policy/refit.py
    for_refit = sampled_refs(stream, wa.sample_rate)[keep] if window is not None and rate > wa.sample_rate else None
    run = GuardedRun(cache.result(), shadow_capacity_blocks=scap)
    times = stream.req_time_s
    start_s = float(times[0])
    if per_request:
        edges = np.arange(n + 1)
    else:
        edges = np.searchsorted(times, start_s + slice_s * np.arange(1, int((times[-1] - start_s) // slice_s) + 2),
                                side="left")
        edges = np.unique(np.concatenate([[0], edges, [n]]))
    lens = cache.engine.req_nstat
    clock = RefitClock(wa.refit_s, start_s + wa.refit_s)
    fed = 0  # requests whose sampled accesses are in the reuse window
    for a, b in itertools.pairwise(edges):
        end_s = float(times[a]) if per_request else start_s + slice_s * (int((times[b - 1] - start_s) // slice_s) + 1)
        req_hits = cache.serve(int(a), int(b))
        hits = int(req_hits.sum())
        lh = int(lru.serve(int(a), int(b)).sum())
        ph = int(pol.serve(int(a), int(b)).sum())
        starts = stream.req_off[a:b]
        own = int((before[starts + req_hits] - before[starts]).sum())  # the cache's hits on sampled refs
        refs = int(sub.req_off[b] - sub.req_off[a])
        switch = None
        if per_request:
            if guard is not None and refs > 0:
                switch = guard.observe_warm(end_s, refs, ph, lh, int(lru.stats[S_EVICTIONS]))
        elif guard is not None:
            # the running order is measured exactly, the other one by its shadow
            in_lru = guard.mode == LRU
            switch = guard.observe_warm(end_s, refs, ph if in_lru else own, own if in_lru else lh,
                                        int(lru.stats[S_EVICTIONS]))
        if switch is not None:
            run.switches.append(switch)
            cache.ip[IP_LRU_ORDER] = int(switch.to_mode == LRU)
            cache.changed()
        refitted = False
        if window is not None and clock.due(end_s):
            _feed(window, sub, fed, int(b), for_refit)  # the accesses since the last refit, in one batch
            fed = int(b)
            run.refits.extend(_refit(window, end_s, stream.categories, (cache, pol), int(cache.ip[IP_MODEL])))
            refitted = True
        est = guard.estimates() if guard is not None else (ph / refs if refs else 0.0, lh / refs if refs else 0.0, refs)
        num_refs = int(lens[a:b].sum())
        run.timeline.append({
            "time_s": end_s, "num_refs": num_refs, "hit_ratio": hits / num_refs if num_refs else float("nan"),
            "num_sampled_refs": refs, "sampled_hit_ratio": own / refs if refs else float("nan"),
            "shadow_policy_hit_ratio": ph / refs if refs else float("nan"),
            "shadow_lru_hit_ratio": lh / refs if refs else float("nan"),
            "window_policy_hit_ratio": est[0], "window_lru_hit_ratio": est[1],
            "guard_mode": guard.mode if guard is not None else "policy", "switched": switch is not None,
            "refit": refitted})
    res = dataclasses.replace(cache.result(), elapsed_s=time.perf_counter() - t0)
    run.result = res
    run.time_in_mode_s = dict(guard.time_in_mode_s) if guard is not None else {"policy": float(times[-1] - start_s)}
    return run


def _wa_params(cache: Cache) -> WaParams | None:
    if cache.spec.name != "wa":
        return None
    names = {f.name for f in dataclasses.fields(WaParams)}
    return WaParams(**{k: v for k, v in cache.params.items() if k in names})


def _feed(window: ReuseWindow, sub: Stream, a: int, b: int, for_refit: np.ndarray | None) -> None:
    """Every sampled access of requests A..B-1 into WINDOW (those FOR_REFIT only, a bool per reference of
    SUB, when given)."""
    off = sub.req_off
    lens = np.diff(off[a:b + 1])
    keys, cats = sub.blk[off[a]:off[b]], np.repeat(sub.req_cat[a:b], lens)
    times = np.repeat(sub.req_time_s[a:b], lens)
    if for_refit is not None:
        m = for_refit[off[a]:off[b]]
        keys, cats, times = keys[m], cats[m], times[m]
    window.add(keys, cats, times)


def _refit(window: ReuseWindow, now_s: float, names: tuple[str, ...], caches: tuple[Cache, ...],
           model: int) -> list[dict[str, Any]]:
    """Refit from WINDOW at NOW_S, write the new columns into every cache's cw; one row per category."""
    samples = window.samples(now_s)
    cw = caches[0].cw
    current = {c: CategoryFit(float(cw[CW_P, c]), float(cw[CW_RATE, c]), tuple(float(v) for v in cw[CW_TABLE:, c]))
               for c in samples}
    fits, metrics = refit(samples, current, model)
    rows = []
    for c in sorted(samples):
        old, new = current[c], fits.get(c)
        if new is not None:
            for cache in caches:
                cache.cw[CW_P, c], cache.cw[CW_RATE, c] = new.reuse_prob, new.rate_per_s
                cache.cw[CW_TABLE:, c] = new.km_cdf
        rows.append({"time_s": now_s, "category": names[c], "refitted": new is not None,
                     "old_reuse_prob": old.reuse_prob, "old_rate_per_s": old.rate_per_s,
                     "new_reuse_prob": (new or old).reuse_prob, "new_rate_per_s": (new or old).rate_per_s,
                     **metrics[c]})
    if fits:
        for cache in caches:
            cache.changed()
    return rows


def predict_guarded(tables: RunTables, req_idx: np.ndarray, engine_block_size: int, num_engine_blocks: int,
                    policy: str, fit: PolicyParams, wa_params: dict[str, Any],
                    output_tokens: np.ndarray | None = None) -> GuardedRun:
    """predict_request_hits (sim.engine_model) for the vLLM plugin running POLICY (wa, or fitted resolving
    to wa) with the guard and refit of WA_PARAMS (WaParams names: what the plugin's KVTRACE_GUARD*
    variables set): the engine's guard (per_request), its run with the hit tokens per request. Fitted
    resolving to a baseline runs that baseline plain (the plugin guards WA only)."""
    full, shape, capacity = engine_case(tables, req_idx, engine_block_size, num_engine_blocks, fit, output_tokens)
    if policy == FITTED and resolve_fitted(fit, capacity, full.block_size)[0] != "wa":
        wa_params = {}
    return simulate_guarded(full, policy, capacity, params=wa_params, fit=fit, engine=shape, timing=False,
                            per_request=True)
