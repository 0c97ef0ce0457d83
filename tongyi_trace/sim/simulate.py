"""Run one policy at one capacity over a Stream: the typed entry points (Cache, simulate_policy) over the
compiled kernel."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from tongyi_trace.errors import UsageError
from tongyi_trace.fit.params import PolicyParams
from tongyi_trace.sim.kernel import (
    NUM_STATS,
    S_BYPASS,
    S_EVICT_AGE_US,
    S_EVICT_CYCLES,
    S_EVICTIONS,
    S_HIT_TOKENS,
    S_HITS,
    S_ORPHANED,
    S_ORPHANING,
    S_PARKED,
    S_REFS,
    S_TIMED_EVICTIONS,
    S_TOUCHED,
    cached_prefix_len,
    policy_kernel,
)
from tongyi_trace.sim.policy_base import InitContext
from tongyi_trace.sim.registry import FITTED, Policy, get_policy
from tongyi_trace.sim.stream import Stream
from tongyi_trace.sim.structs import G_SIZE, cycles_now, make_state


@dataclass(frozen=True)
class EngineShape:
    """Per-request engine details (see engine_model.py); absent = plain trace semantics."""

    req_maxhit: np.ndarray  # int64[N]: at most this many leading blocks may hit
    req_nstat: np.ndarray  # int64[N]: leading blocks that count in the statistics
    req_extra: np.ndarray  # int64[N]: slots held while running, free afterwards


@dataclass
class PolicyResult:
    """Hit statistics of one policy at one capacity."""

    policy: str
    capacity_blocks: int
    num_refs: int
    num_hits: int
    num_tokens: int
    num_hit_tokens: int
    num_evictions: int
    num_bypassed: int
    num_touched_misses: int
    orphaned_refs: int  # refs to a cached block that could not hit because an ancestor was missing
    num_parked: int  # leaf_only: victims held back while they had cached children
    num_orphaning_evictions: int  # evictions of a block that still had cached children
    mean_eviction_age_s: float  # mean time since last access of the evicted blocks
    evict_decision_ns: float  # mean time per eviction, measured inside the kernel (on a sample of eviction runs)
    elapsed_s: float
    params: dict[str, Any]
    per_category: dict[str, dict[str, float]] = field(default_factory=dict)
    req_hit_blocks: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    req_hit_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)

    @property
    def hit_ratio(self) -> float:
        """Block hit ratio."""
        return self.num_hits / self.num_refs if self.num_refs else 0.0

    @property
    def token_hit_ratio(self) -> float:
        """Hit tokens over prompt tokens."""
        return self.num_hit_tokens / self.num_tokens if self.num_tokens else 0.0

    @property
    def refs_per_s(self) -> float:
        """Simulation speed."""
        return self.num_refs / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """A flat JSON-able row (no per-request arrays)."""
        return {"policy": self.policy, "capacity_blocks": self.capacity_blocks, "num_refs": self.num_refs,
                "num_hits": self.num_hits, "hit_ratio": self.hit_ratio, "num_tokens": self.num_tokens,
                "num_hit_tokens": self.num_hit_tokens, "token_hit_ratio": self.token_hit_ratio,
                "num_evictions": self.num_evictions, "num_bypassed": self.num_bypassed,
                "num_touched_misses": self.num_touched_misses, "orphaned_refs": self.orphaned_refs,
                "num_parked": self.num_parked, "num_orphaning_evictions": self.num_orphaning_evictions,
                "mean_eviction_age_s": self.mean_eviction_age_s,
                "evict_decision_ns": self.evict_decision_ns, "elapsed_s": self.elapsed_s,
                "params": self.params, "per_category": self.per_category}


@lru_cache(maxsize=1)
def cycles_per_ns() -> float:
    """CPU cycle-counter ticks per nanosecond (calibrated once per process)."""
    cycles_now()
    t0, c0 = time.perf_counter_ns(), cycles_now()
    while time.perf_counter_ns() - t0 < 20_000_000:
        pass
    t1, c1 = time.perf_counter_ns(), cycles_now()
    return max((c1 - c0) / (t1 - t0), 1e-9)


def resolve_fitted(fit: PolicyParams, capacity_blocks: int, block_size: int,
                   ) -> tuple[str, dict[str, Any], str | None]:
    """(policy, parameters, choice's capacity label) that the policy file chose for a cache of
    CAPACITY_BLOCKS blocks of BLOCK_SIZE tokens: its nearest choice, or WA with its defaults when the file
    has no choices."""
    choice = fit.choice_for(capacity_blocks * block_size)
    if choice is None:
        return "wa", {}, None
    return choice.policy, dict(choice.params), choice.capacity


class Cache:
    """One prefix cache under one policy, served request by request: the state survives between calls,
    so a caller can interleave several caches (a fleet behind a router), look inside between requests,
    or change settings between slices. `simulate_policy` is `Cache(...).serve(0, N)` then `.result()`.

    Arguments as simulate_policy's; the stream's requests are served in index order by `serve`. The
    policy's parameters `ip`, `fp` and its tables `cw` (float) and `nxt` (int) are what its init hook
    made (policy_base.Setup); a driver may change them between slices (WA's switches, wa.IP_*)."""

    def __init__(self, stream: Stream, policy: str | Policy, capacity_blocks: int, *,
                 params: dict[str, Any] | None = None, fit: PolicyParams | None = None,
                 engine: EngineShape | None = None, next_req: np.ndarray | None = None,
                 timing: bool = True) -> None:
        if str(policy) == FITTED:
            if fit is None:
                raise UsageError("policy fitted needs fitted parameters: pass --policy-file policy.json "
                                 "(from 'kvtrace fit')")
            policy, chosen, _ = resolve_fitted(fit, capacity_blocks, stream.block_size)
            params = {**chosen, **(params or {})}
        spec = get_policy(policy)
        typed, self.leaf_only = spec.make_params(params)
        if spec.needs_fit and fit is None:
            raise UsageError(f"policy {spec.name} needs fitted parameters: pass --policy-file policy.json "
                             "(from 'kvtrace fit')")
        if capacity_blocks < 0:
            raise UsageError(f"capacity must be >= 0 blocks, got {capacity_blocks}")
        self.spec, self.stream, self.capacity_blocks, self.timing = spec, stream, int(capacity_blocks), timing
        self.params = {**dataclasses.asdict(typed), "leaf_only": self.leaf_only}
        setup = spec.hooks.init(typed, InitContext(stream, self.capacity_blocks, fit, next_req))
        self.ip, self.fp, self.cw, self.nxt = setup.ip, setup.fp, setup.ft, setup.it
        n = stream.num_requests
        if engine is None:
            lens = np.diff(stream.req_off)
            engine = EngineShape(lens, lens, np.zeros(n, np.int64))
        self.engine = engine
        self.state = make_state(stream.num_ids, setup.num_queues, setup.heap_size, setup.g0, setup.gf0)
        self.kernel = policy_kernel(spec.name, spec.hooks)
        self.stats = np.zeros(NUM_STATS, np.int64)
        self.cat_stats = np.zeros((max(len(stream.categories), 1), 4), np.int64)
        self.req_hit_blocks = np.zeros(n, np.int64)
        self.req_hit_tokens = np.zeros(n, np.int64)
        self.elapsed_s = 0.0

    def serve(self, start: int, stop: int) -> np.ndarray:
        """Serve requests START..STOP-1 (in order); return their hit blocks."""
        st, e = self.stream, self.engine
        t0 = time.perf_counter()
        bk, hp, g, gf, qs, rl = self.state
        stats, hits, hit_tok, cats = self.kernel(
            st.req_off[start:stop + 1], st.blk, st.ntok, st.req_cat[start:stop], st.req_time_s[start:stop],
            e.req_maxhit[start:stop], e.req_nstat[start:stop], e.req_extra[start:stop], self.capacity_blocks,
            bk, hp, g, gf, qs, self.ip, self.fp, self.cw, self.nxt, st.parent, rl, self.leaf_only, self.timing)
        self.elapsed_s += time.perf_counter() - t0
        self.stats += stats
        self.cat_stats[:len(cats)] += cats
        self.req_hit_blocks[start:stop] = hits
        self.req_hit_tokens[start:stop] = hit_tok
        return hits

    def cached_prefix(self, r: int) -> int:
        """How many leading blocks of request R are cached now (what a prefix-aware router asks)."""
        return int(cached_prefix_len(self.stream.req_off, self.stream.blk, self.state[0], r))

    @property
    def num_cached(self) -> int:
        """Blocks cached now."""
        return int(self.state[2][G_SIZE])

    def result(self) -> PolicyResult:
        """The statistics of every request served so far."""
        st, stats = self.stream, self.stats
        cat_tokens = np.bincount(st.req_cat, weights=st.req_tokens, minlength=len(st.categories))
        per_cat = {}
        for i, name in enumerate(st.categories):
            refs, hits, _, htok = (int(v) for v in self.cat_stats[i])
            per_cat[name] = {"num_refs": refs, "num_hits": hits, "hit_ratio": hits / refs if refs else 0.0,
                             "token_hit_ratio": htok / cat_tokens[i] if cat_tokens[i] else 0.0}
        nev, timed = int(stats[S_EVICTIONS]), int(stats[S_TIMED_EVICTIONS])
        ev_ns = float(stats[S_EVICT_CYCLES]) / cycles_per_ns() / timed if (self.timing and timed) else 0.0
        return PolicyResult(
            policy=self.spec.name, capacity_blocks=self.capacity_blocks, num_refs=int(stats[S_REFS]),
            num_hits=int(stats[S_HITS]), num_tokens=int(st.req_tokens.sum()),
            num_hit_tokens=int(stats[S_HIT_TOKENS]), num_evictions=nev, num_bypassed=int(stats[S_BYPASS]),
            num_touched_misses=int(stats[S_TOUCHED]), orphaned_refs=int(stats[S_ORPHANED]),
            num_parked=int(stats[S_PARKED]), num_orphaning_evictions=int(stats[S_ORPHANING]),
            mean_eviction_age_s=float(stats[S_EVICT_AGE_US]) * 1e-6 / nev if nev else 0.0,
            evict_decision_ns=ev_ns, elapsed_s=self.elapsed_s, params=dict(self.params),
            per_category=per_cat, req_hit_blocks=self.req_hit_blocks.copy(),
            req_hit_tokens=self.req_hit_tokens.copy())


def simulate_policy(stream: Stream, policy: str | Policy, capacity_blocks: int, *,
                    params: dict[str, Any] | None = None, fit: PolicyParams | None = None,
                    engine: EngineShape | None = None, next_req: np.ndarray | None = None,
                    timing: bool = True) -> PolicyResult:
    """Replay STREAM through POLICY with a cache of CAPACITY_BLOCKS blocks.

    PARAMS: the policy's own parameters (typed, unknown keys are errors); FIT: the policy file (WA needs
    it); NEXT_REQ: precomputed next use per reference (ORACLE; computed when absent). POLICY "fitted" runs
    what FIT chose for this capacity (resolve_fitted), PARAMS on top."""
    cache = Cache(stream, policy, capacity_blocks, params=params, fit=fit, engine=engine, next_req=next_req,
                  timing=timing)
    cache.serve(0, stream.num_requests)
    return cache.result()


