"""Run one policy at one capacity over a Stream: the typed entry points (Cache, simulate_policy) over the
compiled kernel; and two tiers, HBM over DRAM, each under its own policy (TieredCache, simulate_tiered).

The two-tier model (exact; docs/fleet.md "Tiers"): a cache of C blocks is an HBM tier of H blocks under
its policy over a DRAM tier of C - H blocks under its own, exclusive (a block is in one tier at most).
Per request, in arrival order:
1. every block of the request that DRAM holds leaves DRAM (it is read into HBM);
2. the hit is the longest prefix of the request's blocks cached in either tier (capped as the kernel
   caps it); its blocks that were in DRAM are the DRAM hits (loaded: c per token in the cost model),
   the others HBM hits (free); blocks after the prefix are misses wherever they were (recomputed);
3. HBM serves the request as the single-cache kernel does (hit blocks pinned, the rest inserted; the
   promoted blocks inserted after the HBM-cached prefix is pinned), evicting by its policy;
4. each block HBM evicted is demoted into DRAM in eviction order, ordered there by DRAM's policy as a
   release at its last reference and last access, DRAM evicting (dropping) by its policy to make room.
A request longer than HBM leaves the blocks that do not fit uncached (bypass), as a single cache does.
With LRU in both tiers the tiers together hold exactly what one LRU cache of C blocks holds and HBM what
one of H blocks holds (the LRU stack property; tested), whenever no request outgrows HBM.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from numba import typeof

from tongyi_trace.errors import UsageError
from tongyi_trace.policy.file import PolicyParams
from tongyi_trace.sim.kernel import (
    NUM_STATS,
    S_BYPASS,
    S_EVICT_AGE_US,
    S_EVICT_CYCLES,
    S_EVICTIONS,
    S_HIT_TOKENS,
    S_HITS,
    S_LOW_HIT_TOKENS,
    S_LOW_HITS,
    S_ORPHANED,
    S_ORPHANING,
    S_PARKED,
    S_REFS,
    S_TIMED_EVICTIONS,
    S_TOUCHED,
    TIER_LOWER,
    TIER_NONE,
    TIER_UPPER,
    cached_prefix_len,
    policy_kernel,
    promote,
)
from tongyi_trace.sim.policy_base import InitContext
from tongyi_trace.sim.registry import FITTED, Policy, get_policy
from tongyi_trace.sim.stream import Stream, readonly
from tongyi_trace.sim.structs import (
    G_EPOCH,
    G_SIZE,
    MAX_INSERTIONS,
    NARROW_ROWS,
    NUM_ROWS,
    cycles_now,
    make_slots,
    make_state,
    slots_for,
)

_NO_TIER = np.zeros(1, np.int64)  # the plain kernel's (unread) two-tier arrays: low, out
_NO_LREL = np.zeros((4, 1), np.int64)  # and lrel
_NO_MAP = np.zeros(0, np.int32)  # a state per block's (unread) slot map and slots (structs.make_slots)
_NO_SLOTS = np.zeros((2, 0), np.int64)


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


def _resolved(policy: str | Policy, params: dict[str, Any] | None, fit: PolicyParams | None,
              capacity_blocks: int, block_size: int) -> tuple[str | Policy, dict[str, Any] | None]:
    """(POLICY, PARAMS), with "fitted" replaced by what FIT chose for CAPACITY_BLOCKS (PARAMS on top)."""
    if str(policy) != FITTED:
        return policy, params
    if fit is None:
        raise UsageError("policy fitted needs fitted parameters: pass --policy-file policy.json "
                         "(from 'kvtrace fit')")
    name, chosen, _ = resolve_fitted(fit, capacity_blocks, block_size)
    return name, {**chosen, **(params or {})}


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
    made (policy_base.Setup); a driver may change them between slices (WA's switches, wa.IP_*) and then
    calls `changed`. TIERED: the cache is the HBM tier of a TieredCache (the kernel's TIER_UPPER switch, with
    the arrays `low`, `lrel` and `out` the TieredCache gives it). A policy without a heap or columns of
    its own keeps one cache line per block (structs.NARROW_ROWS). SLOTTED: the state has rows per cache
    slot instead of per block id (structs.py; the chunked simulator's), so it is bounded by the capacity;
    the results are the same, but `cached_prefix` and the tiers need a state per block."""

    def __init__(self, stream: Stream, policy: str | Policy, capacity_blocks: int, *,
                 params: dict[str, Any] | None = None, fit: PolicyParams | None = None,
                 engine: EngineShape | None = None, next_req: np.ndarray | None = None,
                 timing: bool = True, tiered: bool = False, slotted: bool = False) -> None:
        policy, params = _resolved(policy, params, fit, capacity_blocks, stream.block_size)
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
        if stream.num_refs > MAX_INSERTIONS:  # each reference inserts a block at most once (structs.FOREST)
            raise UsageError(f"the simulator takes at most {MAX_INSERTIONS:,} references; this stream has "
                             f"{stream.num_refs:,}: simulate a shorter window of the trace")
        narrow = not setup.heap_size and not spec.hooks.STATE.columns
        if slotted and tiered:
            raise ValueError("a tiered cache keeps a state per block")
        self.num_rows = slots_for(self.capacity_blocks, setup.num_retained, stream.num_ids) if slotted \
            else stream.num_ids  # the state's rows of blocks (or slots)
        self.state = make_state(self.num_rows, setup.num_queues, setup.heap_size, setup.g0, setup.gf0,
                                NARROW_ROWS if narrow else NUM_ROWS)
        self.imap: np.ndarray
        self.sl: np.ndarray
        self.imap, self.sl = make_slots(stream.num_ids, self.num_rows, self.state[2]) if slotted \
            else (_NO_MAP, _NO_SLOTS)
        self.kernel = policy_kernel(spec.name, spec.hooks)
        self.tiered = tiered
        self.low, self.lrel, self.out = _NO_TIER, _NO_LREL, _NO_TIER  # the two-tier kernel's (TieredCache)
        self.last_stats = np.zeros(NUM_STATS, np.int64)  # of the last `serve` call
        self.stats = np.zeros(NUM_STATS, np.int64)
        self.cat_stats = np.zeros((max(len(stream.categories), 1), 4), np.int64)
        self.req_hit_blocks = np.zeros(n, np.int64)
        self.req_hit_tokens = np.zeros(n, np.int64)
        self.elapsed_s = 0.0
        self.warmed = False  # warm() has run

    def _run(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The kernel over requests START..STOP-1 (kernel._run_loop's returns)."""
        st, e = self.stream, self.engine
        bk, hp, g, gf, qs, rl = self.state
        return self.kernel(
            st.req_off[start:stop + 1], st.blk, st.ntok, st.req_cat[start:stop], st.req_time_s[start:stop],
            e.req_maxhit[start:stop], e.req_nstat[start:stop], e.req_extra[start:stop], self.capacity_blocks,
            bk, hp, g, gf, qs, self.ip, self.fp, self.cw, self.nxt, st.parent, rl, self.imap, self.sl,
            self.leaf_only, self.timing, self.low, self.lrel, self.out, TIER_UPPER if self.tiered else TIER_NONE)

    def warm(self) -> None:
        """Compile the kernel, or load it from numba's on-disk cache, by serving no request: the speed
        reported (elapsed_s) is then the replay's alone, on a machine's first run too. Once per cache: a
        fleet or a tiered cache serves one request at a time, and asking numba costs ~0.1 us a call."""
        if not self.warmed:
            if not self.kernel.signatures:
                self._run(0, 0)
            self.warmed = True

    def serve(self, start: int, stop: int) -> np.ndarray:
        """Serve requests START..STOP-1 (in order); return their hit blocks."""
        self.warm()
        t0 = time.perf_counter()
        return self.account(start, stop, t0, self._run(start, stop))

    def account(self, start: int, stop: int, t0: float,
                out: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        """Add OUT, the kernel's returns for requests START..STOP-1 (run since T0), to the statistics; return
        their hit blocks."""
        stats, hits, hit_tok, cats = out
        self.elapsed_s += time.perf_counter() - t0
        self.last_stats = stats
        self.stats += stats
        self.cat_stats[:len(cats)] += cats
        self.req_hit_blocks[start:stop] = hits
        self.req_hit_tokens[start:stop] = hit_tok
        return hits

    def changed(self) -> None:
        """Say that a driver changed the policy's parameters (ip, fp, cw, nxt) between slices: a policy that
        keeps what it derived from them recomputes it (structs.G_EPOCH)."""
        self.state[2][G_EPOCH] += 1

    def cached_prefix(self, r: int) -> int:
        """How many leading blocks of request R are cached now (what a prefix-aware router asks)."""
        if self.imap.shape[0]:
            raise ValueError("cached_prefix reads a state per block, not per slot")
        return int(cached_prefix_len(self.stream.req_off, self.stream.blk, self.state[0], self.state[0], r))

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


def tier_policies(policy: str | Policy, params: dict[str, Any] | None, hbm_policy: str | None,
                  fit: PolicyParams | None, capacity_blocks: int, block_size: int,
                  ) -> tuple[tuple[str, dict[str, Any] | None], tuple[str, dict[str, Any] | None]]:
    """((HBM policy, its params), (DRAM policy, its params)) of a two-tier cache of CAPACITY_BLOCKS blocks:
    DRAM runs POLICY with PARAMS ("fitted": what FIT chose for the whole capacity), HBM runs HBM_POLICY
    with its defaults, or the same as DRAM when it is None or the same policy."""
    name, values = _resolved(policy, params, fit, capacity_blocks, block_size)
    dram = (get_policy(name).name, values)
    if hbm_policy is None or get_policy(hbm_policy).name == dram[0]:
        return dram, dram
    return (get_policy(hbm_policy).name, None), dram


@dataclass
class TieredResult:
    """Hit statistics of a two-tier cache (module doc). HBM's result counts the hits over both tiers (the
    prefix runs through them) and its evictions are the demotions; the DRAM figures split them."""

    hbm: PolicyResult
    dram_policy: str
    dram_capacity_blocks: int
    dram_params: dict[str, Any]
    num_dram_hits: int
    num_dram_hit_tokens: int
    num_dram_evictions: int  # blocks dropped from the cache (DRAM's victims)
    elapsed_s: float  # both tiers
    req_dram_hits: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    req_dram_hit_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)

    @property
    def num_hbm_hits(self) -> int:
        """Hits on blocks HBM held."""
        return self.hbm.num_hits - self.num_dram_hits

    @property
    def hit_ratio(self) -> float:
        """Block hit ratio over both tiers."""
        return self.hbm.hit_ratio

    @property
    def hbm_hit_ratio(self) -> float:
        """HBM hits over references."""
        return self.num_hbm_hits / self.hbm.num_refs if self.hbm.num_refs else 0.0

    @property
    def dram_hit_ratio(self) -> float:
        """DRAM hits over references."""
        return self.num_dram_hits / self.hbm.num_refs if self.hbm.num_refs else 0.0


class TieredCache:
    """An HBM tier over a DRAM tier, exclusive, each under its own policy (module doc), served request by
    request like a Cache: HBM is a Cache made with tiered=True, DRAM a Cache over the same stream that
    only `promote` and its policy's demote kernel touch."""

    def __init__(self, hbm: Cache, dram: Cache) -> None:
        if hbm.stream is not dram.stream or not hbm.tiered or dram.tiered:
            raise ValueError("a TieredCache needs a tiered HBM cache and an untiered DRAM cache over the same stream")
        st = hbm.stream
        self.hbm, self.dram, self.stream = hbm, dram, st
        most = hbm.capacity_blocks + (int(np.diff(st.req_off).max()) if st.num_requests else 0) + 1
        hbm.low = np.zeros(st.num_ids, np.int64)
        hbm.lrel = np.zeros((4, st.num_ids), np.int64)
        hbm.out = np.zeros(most, np.int64)  # a request's evictions at most
        self.demote = policy_kernel(dram.spec.name, dram.spec.hooks)
        # the demoted blocks as one-block requests, typed as the stream's arrays (read-only: the loop
        # compiles once for every tier, kernel.policy_kernel)
        self.steps = readonly(np.arange(most + 1, dtype=np.int64))
        self.demoted = readonly(hbm.out)
        self.zeros = np.zeros(most, np.int64)
        self.zeros_ro = readonly(self.zeros)
        self.times = np.zeros(most, np.float64)
        self.times_ro = readonly(self.times)
        self.dram_stats = np.zeros(NUM_STATS, np.int64)
        self.req_dram_hits = np.zeros(st.num_requests, np.int64)
        self.req_dram_hit_tokens = np.zeros(st.num_requests, np.int64)
        self.elapsed_s = 0.0

    @property
    def req_hit_tokens(self) -> np.ndarray:
        """Hit tokens per request served (both tiers)."""
        return self.hbm.req_hit_tokens

    def _demote(self, m: int, now_s: float) -> np.ndarray:
        """Hand the M blocks HBM evicted (hbm.out) at NOW_S to the DRAM tier's demote kernel; its stats."""
        st, hbm, dram = self.stream, self.hbm, self.dram
        bk, hp, g, gf, qs, rl = dram.state
        none = self.zeros[:m]
        self.times[:m] = now_s
        return self.demote(
            self.steps[:m + 1], self.demoted, st.ntok, self.zeros_ro[:m], self.times_ro[:m], none, none,
            none, dram.capacity_blocks, bk, hp, g, gf, qs, dram.ip, dram.fp, dram.cw, dram.nxt, st.parent, rl,
            dram.imap, dram.sl, dram.leaf_only, False, _NO_TIER, hbm.lrel, _NO_TIER, TIER_LOWER)[0]

    def warm(self) -> None:
        """Compile both tiers' kernels and promote (or load them from numba's cache) outside the timed
        calls, as Cache.warm."""
        self.hbm.warm()
        if not self.demote.signatures:
            self._demote(0, 0.0)
        if not promote.signatures:
            st, dram = self.stream, self.dram
            bk, _, g, _, qs, rl = dram.state
            promote.compile(tuple(typeof(a) for a in (st.req_off, st.blk, 0, bk, g, qs, st.parent, rl,
                                                     self.hbm.low)))

    def serve(self, start: int, stop: int) -> np.ndarray:
        """Serve requests START..STOP-1 (in order); return their hit blocks (both tiers)."""
        st, hbm, dram = self.stream, self.hbm, self.dram
        bk, _, g, _, qs, rl = dram.state
        self.warm()
        t0 = time.perf_counter()
        for r in range(start, stop):
            promote(st.req_off, st.blk, r, bk, g, qs, st.parent, rl, hbm.low)
            hbm.serve(r, r + 1)
            done = hbm.last_stats
            self.req_dram_hits[r] = done[S_LOW_HITS]
            self.req_dram_hit_tokens[r] = done[S_LOW_HIT_TOKENS]
            m = int(done[S_EVICTIONS])
            if m:
                self.dram_stats += self._demote(m, float(st.req_time_s[r]))
        self.elapsed_s += time.perf_counter() - t0
        return hbm.req_hit_blocks[start:stop]

    def cached_prefix(self, r: int) -> int:
        """How many leading blocks of request R are cached now in either tier."""
        return int(cached_prefix_len(self.stream.req_off, self.stream.blk, self.hbm.state[0], self.dram.state[0], r))

    def result(self) -> TieredResult:
        """The statistics of every request served so far."""
        return TieredResult(
            hbm=self.hbm.result(), dram_policy=self.dram.spec.name, dram_capacity_blocks=self.dram.capacity_blocks,
            dram_params=dict(self.dram.params), num_dram_hits=int(self.req_dram_hits.sum()),
            num_dram_hit_tokens=int(self.req_dram_hit_tokens.sum()),
            num_dram_evictions=int(self.dram_stats[S_EVICTIONS]), elapsed_s=self.elapsed_s,
            req_dram_hits=self.req_dram_hits.copy(), req_dram_hit_tokens=self.req_dram_hit_tokens.copy())


def simulate_tiered(stream: Stream, policy: str | Policy, capacity_blocks: int, hbm_blocks: int, *,
                    hbm_policy: str | None = None, params: dict[str, Any] | None = None,
                    fit: PolicyParams | None = None, engine: EngineShape | None = None,
                    next_req: np.ndarray | None = None) -> TieredResult:
    """Replay STREAM through a cache of CAPACITY_BLOCKS blocks split into HBM_BLOCKS of HBM (under
    HBM_POLICY with its defaults; None: POLICY) over DRAM (under POLICY with PARAMS): the module doc's
    two-tier model; arguments as simulate_policy."""
    if not 0 <= hbm_blocks < capacity_blocks:
        raise UsageError(f"the HBM tier needs 0 <= {hbm_blocks} < {capacity_blocks} blocks (the whole cache)")
    (hp_, hpar), (dp, dpar) = tier_policies(policy, params, hbm_policy, fit, capacity_blocks, stream.block_size)
    hbm = Cache(stream, hp_, hbm_blocks, params=hpar, fit=fit, engine=engine, next_req=next_req, timing=False,
                tiered=True)
    dram = Cache(stream, dp, capacity_blocks - hbm_blocks, params=dpar, fit=fit, next_req=next_req, timing=False)
    cache = TieredCache(hbm, dram)
    cache.serve(0, stream.num_requests)
    return cache.result()
