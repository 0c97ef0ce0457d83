"""One fleet configuration over a Stream: N instances behind a router, each a `Cache` (sim/simulate.py)
over the same stream serving only the requests routed to it, plus its own FIFO prefill queue under the
QTTFT cost model (sim/cost_model.py).

Tiers per instance (docs/fleet.md): the instance's cache of CAPACITY blocks is HBM + CPU DRAM. With
`hbm_blocks` H < CAPACITY it is a `TieredCache` (sim/simulate.py: the exact two-tier model, an
exclusive hierarchy with demotion; HBM under `hbm_policy` or the instance's policy, DRAM under the
instance's policy); DRAM hits are loaded at the cost model's c per token, and routers see the prefix
cached in either tier. An optional shared remote pool (one for the fleet, written
through by every instance) is a cache of `remote_blocks` serving every request; a request hits
max(local prefix, remote prefix), the part beyond the local prefix loaded at `remote_s_per_token`.
With one instance and one tier this is exactly `simulate_policy` (tested). With an `EngineShape`
(sim/engine_model.py) every instance models a vLLM engine, as `kvtrace replay` across several servers
routes and reconciles (replay/fleet.py).

A block table holds a row per distinct block of the stream (~0.5 s to allocate on the default to-C
trace): a `CachePool` keeps the caches of one configuration between simulations and resets each by
restoring only the rows of the blocks it served, so a sweep allocates them once per configuration.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numba import njit
from numba.typed import List

from tongyi_trace.atomic import json_default
from tongyi_trace.errors import UsageError
from tongyi_trace.fleet.routers import Router, get_router
from tongyi_trace.policy.file import PolicyParams
from tongyi_trace.sim.cost_model import CostModel, qttft_s, summarize_qttft
from tongyi_trace.sim.kernel import cached_prefix_len
from tongyi_trace.sim.simulate import Cache, EngineShape, TieredCache, tier_policies
from tongyi_trace.sim.stream import Stream
from tongyi_trace.sim.structs import G_SIZE, PRESENT, q_head, q_next

DUP_SAMPLES = 4  # request boundaries at which duplication across instances is measured


@dataclass(frozen=True)
class Tiers:
    """The cache tiers below each instance's HBM (sizes in blocks; None = absent)."""

    hbm_blocks: int | None = None  # HBM part of each instance's cache; the rest is CPU DRAM
    hbm_policy: str | None = None  # the HBM tier's policy, with its defaults (None: the instance's policy,
    # which DRAM runs)
    remote_blocks: int | None = None  # one shared remote pool for the fleet
    remote_s_per_token: float = 0.0  # load cost of a remote hit, seconds per token


@dataclass
class FleetResult:
    """Figures of one fleet configuration, and per-request arrays (instance, hits, QTTFT)."""

    router: str
    num_instances: int
    policy: str
    capacity_blocks: int  # per instance (HBM + DRAM)
    num_refs: int
    num_hits: int
    num_hbm_hits: int
    num_dram_hits: int
    num_remote_hits: int
    num_tokens: int
    num_hit_tokens: int
    qttft: dict[str, float]
    requests_per_instance: list[int]
    utilization: list[float]  # prefill time / arrival span (first to last arrival), per instance
    duplication: float  # share of cached blocks held by two or more instances (mean over samples)
    elapsed_s: float
    params: dict[str, Any]
    req_instance: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    req_hit_blocks: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    req_hit_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    req_qttft_s: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    @property
    def hit_ratio(self) -> float:
        """Block hit ratio over every tier."""
        return self.num_hits / self.num_refs if self.num_refs else 0.0

    @property
    def imbalance(self) -> float:
        """Max over mean utilization (1 = perfectly even)."""
        mean = float(np.mean(self.utilization)) if self.utilization else 0.0
        return max(self.utilization) / mean if mean > 0 else 1.0

    def summary(self) -> dict[str, Any]:
        """A flat JSON-able row (no per-request arrays)."""
        refs = self.num_refs or 1
        return {"router": self.router, "num_instances": self.num_instances, "policy": self.policy,
                "capacity_blocks": self.capacity_blocks, "num_refs": self.num_refs, "num_hits": self.num_hits,
                "hit_ratio": self.hit_ratio, "hbm_hit_ratio": self.num_hbm_hits / refs,
                "dram_hit_ratio": self.num_dram_hits / refs, "remote_hit_ratio": self.num_remote_hits / refs,
                "num_tokens": self.num_tokens, "num_hit_tokens": self.num_hit_tokens,
                "token_hit_ratio": self.num_hit_tokens / self.num_tokens if self.num_tokens else 0.0,
                **self.qttft, "utilization": self.utilization, "imbalance": self.imbalance,
                "duplication": self.duplication, "requests_per_instance": self.requests_per_instance,
                "elapsed_s": self.elapsed_s, "params": self.params}


class CachePool:
    """Caches kept between fleet simulations over one stream in one process. `take` hands out a cache in
    its initial state (a returned one, reset, or a new one); `give_back` resets a cache by restoring the
    rows of the blocks of the requests it served (the kernel touches no other row) and the small arrays
    from a copy taken when the cache was new."""

    def __init__(self) -> None:
        self.free: dict[tuple[Any, ...], list[tuple[Cache, _Initial]]] = {}
        self.lent: dict[int, tuple[tuple[Any, ...], _Initial]] = {}
        self.keep: list[Any] = []  # the objects whose id() is part of a key stay alive
        self.per_stream: dict[int, StreamArrays] = {}

    def arrays(self, stream: Stream) -> StreamArrays:
        """STREAM's derived arrays, computed once."""
        if id(stream) not in self.per_stream:
            self.keep.append(stream)
            self.per_stream[id(stream)] = StreamArrays.of(stream)
        return self.per_stream[id(stream)]

    def take(self, stream: Stream, policy: str, capacity_blocks: int, *, params: dict[str, Any] | None,
             fit: PolicyParams | None, engine: EngineShape | None, next_req: np.ndarray | None,
             tiered: bool = False) -> Cache:
        """A cache as `Cache(stream, policy, capacity_blocks, ..., timing=False, tiered=tiered)` returns it."""
        key = _pool_key(stream, policy, capacity_blocks, params, fit, engine, next_req, tiered)
        free = self.free.get(key)
        if free:
            cache, initial = free.pop()
        else:
            self.keep.append((stream, fit, engine, next_req))
            cache = Cache(stream, policy, capacity_blocks, params=params, fit=fit, engine=engine,
                          next_req=next_req, timing=False, tiered=tiered)
            initial = _Initial.of(cache)
        self.lent[id(cache)] = (key, initial)
        return cache

    def give_back(self, cache: Cache, served: np.ndarray) -> None:
        """Reset CACHE (which served the requests where SERVED is true) and keep it for the next `take`."""
        key, initial = self.lent.pop(id(cache))
        initial.restore(cache, served)
        self.free.setdefault(key, []).append((cache, initial))


@dataclass(frozen=True)
class StreamArrays:
    """What the fleet derives from its stream alone."""

    cum_tok: np.ndarray  # int64[refs + 1]: tokens of the blocks before each reference
    first_block: np.ndarray  # int64[N]: first_blocks
    max_id: np.ndarray  # int64[N]: max_id_so_far
    req_tokens: list[int]  # the stream's req_tokens, read per request

    @classmethod
    def of(cls, stream: Stream) -> StreamArrays:
        """The arrays of STREAM."""
        return cls(np.concatenate([[0], np.cumsum(stream.ntok)]).astype(np.int64), first_blocks(stream),
                   max_id_so_far(stream), stream.req_tokens.tolist())


def _pool_key(stream: Stream, policy: str, capacity_blocks: int, params: dict[str, Any] | None,
              fit: PolicyParams | None, engine: EngineShape | None, next_req: np.ndarray | None,
              tiered: bool) -> tuple[Any, ...]:
    return (id(stream), str(policy), int(capacity_blocks),
            json.dumps(params or {}, sort_keys=True, default=json_default), id(fit), id(engine), id(next_req),
            tiered)


@dataclass
class _Initial:
    """What a new cache's state holds outside the rows of its blocks, and one block row."""

    row: np.ndarray  # the row of a block never referenced (bk)
    links: np.ndarray  # rl's column of a block never referenced
    tail: np.ndarray  # bk's queue sentinel rows
    link_tail: np.ndarray  # rl's sentinel columns
    small: list[np.ndarray]  # hp, g, gf, qs

    @classmethod
    def of(cls, cache: Cache) -> _Initial:
        """The initial state of CACHE (new, nothing served)."""
        bk, hp, g, gf, qs, rl = cache.state
        d = cache.stream.num_ids
        return cls(bk[0].copy(), rl[:, 0].copy(), bk[d:].copy(), rl[:, d:].copy(),
                   [a.copy() for a in (hp, g, gf, qs)])

    def restore(self, cache: Cache, served: np.ndarray) -> None:
        """Put CACHE back in its initial state after it served the requests where SERVED is true."""
        bk, hp, g, gf, qs, rl = cache.state
        d = cache.stream.num_ids
        _restore_rows(cache.stream.req_off, cache.stream.blk, served, bk, self.row, rl, self.links)
        bk[d:] = self.tail
        rl[:, d:] = self.link_tail
        for a, a0 in zip((hp, g, gf, qs), self.small, strict=True):
            a[...] = a0
        for counts in (cache.stats, cache.cat_stats, cache.req_hit_blocks, cache.req_hit_tokens):
            counts[...] = 0
        cache.elapsed_s = 0.0


@njit(cache=True)
def _restore_rows(req_off: np.ndarray, blk: np.ndarray, served: np.ndarray, bk: np.ndarray, row: np.ndarray,
                  rl: np.ndarray, links: np.ndarray) -> None:
    """BK[x] = ROW and RL[:, x] = LINKS for every block x of the requests where SERVED is true."""
    for r in range(served.shape[0]):
        if served[r]:
            for k in range(req_off[r], req_off[r + 1]):
                x = blk[k]
                bk[x, :] = row
                rl[0, x] = links[0]
                rl[1, x] = links[1]


class Fleet:
    """The fleet's state while it serves the stream; it is the `FleetView` routers read."""

    def __init__(self, stream: Stream, num_instances: int, policy: str, capacity_blocks: int, *,
                 params: dict[str, Any] | None, fit: PolicyParams | None, next_req: np.ndarray | None,
                 tiers: Tiers, cost: CostModel, session: np.ndarray | None, with_index: bool,
                 engine: EngineShape | None = None, pool: CachePool | None = None) -> None:
        if num_instances < 1:
            raise UsageError(f"--instances must be at least 1, got {num_instances}")
        if session is not None and session.shape[0] != stream.num_requests:
            raise UsageError(f"session array has {session.shape[0]} entries for {stream.num_requests} requests")

        self.pool = pool or CachePool()

        def cache(blocks: int, pol: str = policy, pol_params: dict[str, Any] | None = params,
                  tiered: bool = False) -> Cache:
            return self.pool.take(stream, pol, blocks, params=pol_params, fit=fit, engine=engine,
                                  next_req=next_req, tiered=tiered)

        self.stream, self.num_instances, self.tiers, self.cost = stream, num_instances, tiers, cost
        self.s_per_token = cost.s_per_token
        hbm = tiers.hbm_blocks
        self.local: list[Cache | TieredCache]
        if hbm is not None and hbm < capacity_blocks:
            (hp, hpar), (dp, dpar) = tier_policies(policy, params, tiers.hbm_policy, fit, capacity_blocks,
                                                   stream.block_size)
            self.local = [TieredCache(cache(hbm, hp, hpar, True), cache(capacity_blocks - hbm, dp, dpar))
                          for _ in range(num_instances)]
            upper = [c.hbm for c in self.local if isinstance(c, TieredCache)]
            lower = [c.dram for c in self.local if isinstance(c, TieredCache)]
        else:
            self.local = [cache(capacity_blocks) for _ in range(num_instances)]
            upper = lower = [c for c in self.local if isinstance(c, Cache)]
        self.caches = upper + ([] if lower is upper else lower)  # every cache of every instance
        self.remote = cache(tiers.remote_blocks) if tiers.remote_blocks else None
        self.index: list[Cache] = []
        self.policy_cache = lower[0]  # one cache under the instance's policy (DRAM's with two tiers)
        self.own_index = False  # the router's index is caches of its own (served and given back with the rest)
        if with_index:  # the router's LRU index of routed prompts; the caches themselves when they are LRU
            self.own_index = lower is not upper or upper[0].spec.name != "lru"
            self.index = [cache(capacity_blocks, "lru", None) for _ in range(num_instances)] if self.own_index \
                else upper
        arrays = self.pool.arrays(stream)
        self.sessions = session if session is not None else arrays.first_block
        self.local_states = List([c.state[0] for c in upper])
        self.lower_states = List([c.state[0] for c in lower])
        self.index_states = List([c.state[0] for c in self.index]) if self.index else self.local_states
        self.prefix_out = np.zeros(num_instances, np.int64)
        self.cum_tok = arrays.cum_tok
        self.arrival_s = stream.req_time_s * cost.arrival_scale
        self.arrival: list[float] = self.arrival_s.tolist()  # the same, read per request
        self.req_tokens: list[int] = arrays.req_tokens
        self.max_id = arrays.max_id
        self.free_at = np.full(num_instances, -np.inf)
        self.routed = np.zeros(num_instances, np.int64)

    # ---- FleetView ----
    def outstanding_s(self, r: int) -> np.ndarray:
        """Queued prefill work not done at R's arrival, per instance."""
        return np.maximum(self.free_at - self.arrival_s[r], 0.0)

    def num_routed(self) -> np.ndarray:
        """Requests routed to each instance so far."""
        return self.routed

    def session(self, r: int) -> int:
        """R's conversation."""
        return int(self.sessions[r])

    def indexed_prefix(self, r: int) -> np.ndarray:
        """R's leading blocks in the router's index, per instance."""
        return _prefixes(self.stream.req_off, self.stream.blk, self.index_states, self.index_states, r,
                         self.prefix_out).copy()

    def cached_prefix(self, r: int) -> np.ndarray:
        """R's leading blocks cached on each instance (HBM + DRAM)."""
        return _prefixes(self.stream.req_off, self.stream.blk, self.local_states, self.lower_states, r,
                         self.prefix_out).copy()

    def uncached_tokens(self, r: int, cached_blocks: np.ndarray) -> np.ndarray:
        """R's prompt tokens after CACHED_BLOCKS leading blocks."""
        base = self.stream.req_off[r]
        return self.stream.req_tokens[r] - (self.cum_tok[base + cached_blocks] - self.cum_tok[base])

    # ---- serving ----
    def serve(self, r: int, i: int) -> tuple[int, int, int, int, int, float, float]:
        """Serve R on instance I: (hit blocks, HBM hits, DRAM hits, remote hits, hit tokens, load seconds,
        prefill seconds)."""
        loc = self.local[i]
        local_hits = int(loc.serve(r, r + 1)[0])
        local_tok = int(loc.req_hit_tokens[r])
        dram_hits, dram_tok = 0, 0
        if isinstance(loc, TieredCache):
            dram_hits, dram_tok = int(loc.req_dram_hits[r]), int(loc.req_dram_hit_tokens[r])
        if self.own_index:
            self.index[i].serve(r, r + 1)
        hits, tok, remote_hits, remote_tok = local_hits, local_tok, 0, 0
        if self.remote is not None:
            rh = int(self.remote.serve(r, r + 1)[0])
            if rh > local_hits:
                hits, remote_hits = rh, rh - local_hits
                tok = int(self.remote.req_hit_tokens[r])
                remote_tok = tok - local_tok
        load_s = self.cost.s_per_loaded_token * dram_tok
        if remote_tok:
            load_s += self.tiers.remote_s_per_token * remote_tok
        service = self.cost.overhead_s + self.cost.s_per_token * float(self.req_tokens[r] - tok) + load_s
        self.free_at[i] = max(self.arrival[r], float(self.free_at[i])) + service
        self.routed[i] += 1
        return hits, local_hits - dram_hits, dram_hits, remote_hits, tok, load_s, service

    def give_back(self, inst: np.ndarray) -> None:
        """Return every cache to the pool (INST: the instance that served each request)."""
        for i in range(self.num_instances):
            served = inst == i
            loc = self.local[i]
            for c in ([loc] if isinstance(loc, Cache) else [loc.hbm, loc.dram]) + self.index[i:i + self.own_index]:
                self.pool.give_back(c, served)
        if self.remote is not None:
            self.pool.give_back(self.remote, np.ones(inst.shape[0], np.bool_))

    def duplication_counts(self, r: int) -> tuple[int, int]:
        """(blocks cached on two or more instances, blocks cached on any) after request R (ids are dense in
        order of first reference, so only those below the largest id of requests 0..R can be cached)."""
        count = np.zeros(int(self.max_id[r]) + 1, np.int8)
        for c in self.caches:  # a block is in one tier of an instance at most
            bk, _, g, _, qs, _ = c.state
            if not _add_queued(count, bk, qs, int(g[G_SIZE])):
                _add_present(count, bk)
        return int((count >= 2).sum()), int((count >= 1).sum())


@njit(cache=True)
def _prefixes(req_off: np.ndarray, blk: np.ndarray, states: List, lower: List, r: int, out: np.ndarray) -> np.ndarray:
    """OUT[i] = leading blocks of request R cached in STATES[i] or LOWER[i] (each a Cache's block table: an
    instance's tiers, or STATES again)."""
    for i in range(len(states)):
        out[i] = cached_prefix_len(req_off, blk, states[i], lower[i], r)
    return out


@njit(cache=True)
def _add_queued(count: np.ndarray, bk: np.ndarray, qs: np.ndarray, num_cached: int) -> bool:
    """COUNT[x] += 1 (saturating at 2) for every cached block x when the state's queues hold all NUM_CACHED
    of them (LRU, FIFO: a walk of the cached blocks instead of the whole table) and return True; else
    change nothing and return False (the caller scans the table: _add_present)."""
    found = 0
    for q in range(qs.shape[0]):
        x = q_head(bk, qs, q)
        while x >= 0:
            found += bk[x, PRESENT] == 1
            x = q_next(bk, qs, x)
    if found != num_cached:
        return False
    for q in range(qs.shape[0]):
        x = q_head(bk, qs, q)
        while x >= 0:
            if bk[x, PRESENT] == 1 and count[x] < 2:
                count[x] += 1
            x = q_next(bk, qs, x)
    return True


@njit(cache=True)
def _add_present(count: np.ndarray, bk: np.ndarray) -> None:
    """COUNT[x] += 1 (saturating at 2) for every block x present in the state BK."""
    for x in range(count.shape[0]):
        if bk[x, PRESENT] == 1 and count[x] < 2:
            count[x] += 1


def first_blocks(stream: Stream) -> np.ndarray:
    """Each request's first block id (-1 - index for an empty request): its conversation when the trace
    names none (requests of one conversation share their first block)."""
    out = -1 - np.arange(stream.num_requests, dtype=np.int64)
    nonempty = np.flatnonzero(np.diff(stream.req_off) > 0)
    out[nonempty] = stream.blk[stream.req_off[nonempty]]
    return out


def max_id_so_far(stream: Stream) -> np.ndarray:
    """int64[N]: the largest block id referenced by requests 0..r (-1 before any block)."""
    m = np.full(stream.num_requests, -1, np.int64)
    nonempty = np.flatnonzero(np.diff(stream.req_off) > 0)
    if nonempty.size:
        m[nonempty] = np.maximum.reduceat(stream.blk, stream.req_off[nonempty])
    return np.maximum.accumulate(m) if m.size else m


def simulate_fleet(stream: Stream, router: str | Router, num_instances: int, policy: str, capacity_blocks: int,
                   *, params: dict[str, Any] | None = None, fit: PolicyParams | None = None,
                   next_req: np.ndarray | None = None, tiers: Tiers | None = None, cost: CostModel,
                   session: np.ndarray | None = None, engine: EngineShape | None = None,
                   pool: CachePool | None = None) -> FleetResult:
    """Serve STREAM on NUM_INSTANCES instances of CAPACITY_BLOCKS blocks (HBM + DRAM) each under POLICY
    (params, fit, next_req and engine as simulate_policy), ROUTER choosing the instance of each request at
    its arrival. SESSION: the conversation of each request (default: its first block's id). POOL: where
    the caches come from and go back to (reused by the next simulation with the same settings)."""
    t0 = time.perf_counter()
    rt = get_router(router) if isinstance(router, str) else router
    tiers = tiers or Tiers()
    fleet = Fleet(stream, num_instances, policy, capacity_blocks, params=params, fit=fit, next_req=next_req,
                  tiers=tiers, cost=cost, session=session, with_index=rt.uses_index, engine=engine, pool=pool)
    n = stream.num_requests
    chosen: list[int] = []
    served: list[tuple[int, int, int, int, int, float, float]] = []
    samples = set(np.linspace(0, n, DUP_SAMPLES + 1).astype(np.int64)[1:].tolist()) if num_instances > 1 else set()
    num_dup = num_held = 0
    for r in range(n):
        i = rt.choose(r, fleet)
        if not 0 <= i < num_instances:
            raise UsageError(f"router {rt.name} chose instance {i} of {num_instances}")
        chosen.append(i)
        served.append(fleet.serve(r, i))
        if r + 1 in samples:
            d, h = fleet.duplication_counts(r)
            num_dup += d
            num_held += h
    inst = np.array(chosen, np.int64)
    hits = np.array([row[:5] for row in served], np.int64).reshape(n, 5)  # hits, hbm, dram, remote, hit tokens
    load_s = np.array([row[5] for row in served], np.float64)
    service_s = np.array([row[6] for row in served], np.float64)
    policy_name, params_used = fleet.policy_cache.spec.name, dict(fleet.policy_cache.params)
    if pool is not None:
        fleet.give_back(inst)
    uncached = stream.req_tokens - hits[:, 4]
    q = np.zeros(n)
    unit = replace(cost, s_per_loaded_token=1.0)  # load_s is in seconds already
    for i in range(num_instances):
        sel = inst == i
        q[sel] = qttft_s(unit, stream.req_time_s[sel], uncached[sel], load_s[sel])
    busy = np.bincount(inst, weights=service_s, minlength=num_instances)
    span = float(fleet.arrival_s.max() - fleet.arrival_s.min()) if n else 0.0
    util = (busy / span).tolist() if span > 0 else [0.0] * num_instances  # as cost_model's utilization
    return FleetResult(
        router=rt.name, num_instances=num_instances, policy=policy_name,
        capacity_blocks=int(capacity_blocks), num_refs=stream.num_refs, num_hits=int(hits[:, 0].sum()),
        num_hbm_hits=int(hits[:, 1].sum()), num_dram_hits=int(hits[:, 2].sum()),
        num_remote_hits=int(hits[:, 3].sum()), num_tokens=int(stream.req_tokens.sum()),
        num_hit_tokens=int(hits[:, 4].sum()), qttft=summarize_qttft(q),
        requests_per_instance=np.bincount(inst, minlength=num_instances).tolist(), utilization=util,
        duplication=num_dup / num_held if num_held else 0.0, elapsed_s=time.perf_counter() - t0,
        params=params_used, req_instance=inst, req_hit_blocks=hits[:, 0].copy(),
        req_hit_tokens=hits[:, 4].copy(), req_qttft_s=q)
