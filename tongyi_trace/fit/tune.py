"""Capacity-aware fitting (`kvtrace fit --capacity`): which policy setting to run at each cache size.

For each capacity, every candidate is simulated on the train window (a cold cache at the window start,
the run's requests in arrival order). The default is what vLLM runs, LRU: the choice departs from it only
for a candidate (a baseline or a WA setting) whose gain over LRU is significant at --confidence (default
0.95), by the paired block bootstrap of tongyi_trace.sim.bootstrap (whole sessions resampled, both
policies scored on the same resample from their per-request hits); among the significant candidates it
takes the one whose lower confidence bound is highest, not the highest point value (a setting that wins
by noise on one hour loses by noise on the next). Where LRU stays, the figures name the best candidate
and its interval ("+0.05 +- 0.31: not significant"). The choice, LRU and the other baselines are then
simulated on the test window (intervals there too), and the file records both gains over LRU: the honest
figure is the test one.

Candidates (WA always with prefix closure, leaf_only), searched in two rounds:
    lru, fifo, s3fifo                                      the baselines the vLLM plugin can run
    wa  round 1: model in {exp, km} x conditional in {no, yes}, life window LIFE_FACTORS[1] x A;
        round 2: the best of round 1 with the other windows, LIFE_FACTORS x A and the fitted
        per-category life_s
where A = LRU's mean eviction age at that capacity on the train window (how long an unused block
survives in a cache of that size): the life window is the horizon over which "will it be reused" is
worth asking, and it scales with the cache, not with the trace's lifespans. Ten simulations per
capacity; the full grid (19) measured no better on the default to-C trace (within 0.1 points).

Capacities are resolved against the whole run (as `kvtrace simulate` does), so `-c 0.5L` means the same
number of blocks in the policy file and in a simulation of the run.

Memory (PLAN, sim/streamed.py's plan_fit under --memory-limit-gib): when the whole stream fits, the windows
are loaded as streams and each round's simulations run on the executor, as many at once as the budget
holds; when it does not, nothing holds the whole stream: the `L` capacities come from the out-of-core pass
of sim/streamed.py, each window is a range of requests (the run is in arrival order) replayed from a cold
cache in chunks of the run's tables (sim/chunked.py's simulate_chunked_many: one read of each chunk serves
a pass of up to PLAN.jobs candidates), with the same results, request for request.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tongyi_trace.budget import MemoryBudget, held_now_bytes, resolve_budget
from tongyi_trace.errors import KvtraceError, UsageError
from tongyi_trace.executor import ExecutorOptions, TaskOutcome, map_tasks, sized_for
from tongyi_trace.fit.events import Window
from tongyi_trace.models import ModelPreset
from tongyi_trace.policy.file import PolicyChoice, PolicyParams, RequestContext, setting_label
from tongyi_trace.policy.names import PLUGIN_BASELINES as BASELINE_CANDIDATES
from tongyi_trace.run import RunDir, RunTables
from tongyi_trace.sim.bootstrap import (
    DEFAULT_CONFIDENCE,
    Interval,
    Resampler,
    check_confidence,
    significant_best,
    stream_resampler,
)
from tongyi_trace.sim.capacity import Capacity, parse_capacities, peak_live_blocks
from tongyi_trace.sim.chunked import ChunkedTask, simulate_chunked_many, stream_shape
from tongyi_trace.sim.registry import get_policy
from tongyi_trace.sim.shared_stream import share_streams, worker_stream
from tongyi_trace.sim.simulate import PolicyResult, simulate_policy
from tongyi_trace.sim.stream import Stream, load_stream, next_request_of_refs
from tongyi_trace.sim.streamed import SweepPlan, passes, peak_live_out_of_core

DEFAULT_CAPACITIES = "1L"
ProgressFn = Callable[[str, int, int], None]  # (what, done, total): a count of the work of one phase
LIFE_FACTORS = (0.05, 0.25, 1.0)


@dataclass(frozen=True)
class Candidate:
    """One setting: a policy and its parameters."""

    policy: str
    params: dict[str, Any]

    @property
    def label(self) -> str:
        """e.g. 'wa model=km conditional=True life_s=12.5' or 'lru' (params.setting_label)."""
        return setting_label(self.policy, self.params)


def first_round(eviction_age_s: float) -> list[Candidate]:
    """The baselines, then WA over model x conditional at the middle life window (see the module doc)."""
    life = max(LIFE_FACTORS[1] * eviction_age_s, 0.01)
    return [Candidate(p, {}) for p in BASELINE_CANDIDATES] + [
        Candidate("wa", {"model": m, "conditional": c, "life_s": life})
        for m in ("exp", "km") for c in (False, True)]


def second_round(best_wa: Candidate, eviction_age_s: float) -> list[Candidate]:
    """BEST_WA's model and conditional with the other life windows and the fitted per-category life_s."""
    lives = [max(f * eviction_age_s, 0.01) for i, f in enumerate(LIFE_FACTORS) if i != 1] + [0.0]
    return [Candidate("wa", {**best_wa.params, "life_s": life}) for life in lives]


def window_requests(arrival_s: np.ndarray, w: Window) -> tuple[int, int]:
    """The requests inside window W as the range (first, stop) of req_idx: the run is in arrival order
    (ARRIVAL_S per req_idx, non-decreasing), so a window's requests are contiguous."""
    if arrival_s.size > 1 and bool(np.any(np.diff(arrival_s) < 0)):
        raise UsageError("requests.parquet: arrival_s is not in req_idx order; re-run 'kvtrace ingest'")
    first = int(np.searchsorted(arrival_s, w.start_s, side="left"))
    if w.include_end:
        return first, int(np.searchsorted(arrival_s, w.end_s, side="right"))
    return first, int(np.searchsorted(arrival_s, w.end_s, side="left"))


def window_stream(tables: RunTables, w: Window, context: RequestContext | None = None) -> Stream:
    """The run's requests that arrive inside window W, as a stream (cold cache at W's start), categories
    as a policy fitted with CONTEXT sees them."""
    reqs = tables.requests().select("req_idx", "arrival_s")
    t = reqs["arrival_s"].to_numpy()
    idx = reqs["req_idx"].to_numpy()[w.contains(t)]
    return load_stream(tables, np.sort(idx).astype(np.int64), context)


def _simulate_task(task: tuple[str, str, dict[str, Any], int], shared: Mapping[str, Any]) -> dict[str, Any]:
    """One candidate at one capacity on one window (runs in an executor's worker)."""
    window, pol, params, blocks = task
    fit = shared[f"fit.{window}"]
    r = simulate_policy(worker_stream(shared, window), pol, blocks, params=dict(params), fit=fit, timing=False)
    return _task_row(r)


def _relabel(count: ProgressFn, label: str, _step: str, done: int, total: int) -> None:
    """COUNT(LABEL, DONE, TOTAL): a chunked pass's progress under the round's name."""
    count(label, done, total)


def _task_row(r: PolicyResult) -> dict[str, Any]:
    """What tune keeps of one simulation."""
    return {"hit_ratio": r.hit_ratio, "num_hits": r.num_hits, "num_refs": r.num_refs,
            "mean_eviction_age_s": r.mean_eviction_age_s, "orphaned_refs": r.orphaned_refs,
            "req_hit_blocks": r.req_hit_blocks}


def tune(run: RunDir, policy: PolicyParams, train: Window, test: Window | None, capacities: str, *,
         model: ModelPreset | None = None, executor: ExecutorOptions | None = None,
         on_step: Callable[[str], None] | None = None, on_progress: ProgressFn | None = None,
         select: tuple[PolicyParams, Window] | None = None, confidence: float = DEFAULT_CONFIDENCE,
         plan: SweepPlan | None = None, budget: MemoryBudget | None = None,
         ) -> tuple[list[PolicyChoice], list[dict[str, Any]]]:
    """Choose a setting per capacity on TRAIN with POLICY, check it on TEST; returns (choices, every
    evaluated row). SELECT = (a policy fitted on part of TRAIN, the held-out rest of TRAIN): choose there
    instead, with that policy (rows of window "train" are then the held-out part's), so the choice is made
    on requests its parameters have not seen; a candidate replaces LRU only when its gain is significant at
    CONFIDENCE (see the module doc). The simulations of each round run on EXECUTOR
    (tongyi_trace.executor: the local pool or Ray); ON_PROGRESS counts them, round by round. PLAN: the
    memory plan (plan_fit; None: the whole stream, the executor's jobs) within BUDGET (None: the default);
    a streamed plan replays the windows in chunks (see the module doc)."""
    check_confidence(confidence)
    step = on_step or (lambda _msg: None)
    count = on_progress or (lambda _what, _done, _total: None)
    tables = run.tables()
    streamed = plan is not None and plan.streamed
    budget_ = budget or resolve_budget(None)
    chunk_refs = budget_.chunk_refs
    choose_with, choose_on = select if select is not None else (policy, train)
    fits = {"train": choose_with, "test": policy}
    reqs = tables.requests()
    sessions = reqs["session_id"].to_numpy()
    if streamed:
        num_refs, num_ids = int(reqs["num_blocks"].sum()), int(tables.provenance.get("num_distinct_blocks") or 0)
        if num_refs == 0:
            raise UsageError(f"{tables.blocks_path}: no block references; nothing to tune")
        arrival_s = reqs["arrival_s"].to_numpy()
        spans = {"train": window_requests(arrival_s, choose_on)} | (
            {"test": window_requests(arrival_s, test)} if test is not None else {})
        lens = reqs["num_blocks"].to_numpy().astype(np.int64)
        shapes = {w: stream_shape(run, policy.context, span) for w, span in spans.items()}
        boot = {w: WindowBootstrap.of(shapes[w], sessions, confidence, refs=lens[span[0]:span[1]])
                for w, span in spans.items()}
        step("capacity-aware fit: the oracle's peak live set, out of core")
        caps = parse_capacities(capacities, num_distinct=num_ids, block_size_tokens=shapes["train"].block_size,
                                model=model, peak_live=peak_live_out_of_core(run, chunk_refs, count))
        del shapes
        shared: dict[str, Any] = {}
        opts = ExecutorOptions()
    else:
        full = load_stream(tables)
        if full.num_refs == 0:
            raise UsageError(f"{tables.blocks_path}: no block references; nothing to tune")
        nxt = next_request_of_refs(full.req_off, full.blk, full.num_ids)
        caps = parse_capacities(capacities, num_distinct=full.num_ids, block_size_tokens=full.block_size,
                                model=model, peak_live=int(peak_live_blocks(full.req_off, nxt)))
        del full, nxt
        windows = {"train": window_stream(tables, choose_on, policy.context)}
        if test is not None:
            windows["test"] = window_stream(tables, test, policy.context)
        boot = {w: WindowBootstrap.of(st, sessions, confidence) for w, st in windows.items()}
        shared = share_streams(windows)
        shared.update({f"fit.{w}": f for w, f in fits.items()})
        opts = sized_for(executor or ExecutorOptions(), windows["train"].num_refs)

    def run_streamed(tasks: list[tuple[str, str, dict[str, Any], int]], done: Callable[[TaskOutcome], None],
                     what: str) -> None:
        """The tasks (window, policy, params, capacity blocks) in passes over each window's chunks, up to
        PLAN.jobs a pass, fewer where the budget holds fewer at their capacities (streamed.passes); WA without its
        guard and refit (simulate_policy runs neither). ON_PROGRESS counts each pass's references."""
        for w, span in spans.items():
            mine = [(k, t) for k, t in enumerate(tasks) if t[0] == w]
            groups = passes(mine, lambda kt: kt[1][3], num_ids, span[1] - span[0], budget_,
                            max(1, plan.jobs if plan is not None else 1), held_now_bytes(),
                            lambda kt: get_policy(kt[1][1]).retained_blocks(kt[1][2], kt[1][3]))
            for num, batch in enumerate(groups, 1):
                label = f"capacity-aware fit: {what}, pass {num} of {len(groups)} ({len(batch)} in chunks)"
                results = simulate_chunked_many(
                    run, [ChunkedTask(pol, blocks, {**params, **({"guard": False, "refit_s": 0.0} if pol == "wa"
                                                                   else {})}) for _, (_, pol, params, blocks) in batch],
                    chunk_refs=chunk_refs, fit=fits[w], timing=False, requests=span,
                    on_progress=functools.partial(_relabel, count, label))
                for (k, _), r in zip(batch, results, strict=True):
                    done(TaskOutcome(k, _task_row(r)))

    def run_round(items: list[tuple[int, str, Candidate]], what: str) -> list[dict[str, Any]]:
        """Simulate each (capacity index, window, candidate); rows in ITEMS order."""
        step(f"capacity-aware fit: {what} ({len(items)} simulations)")
        values: list[Any] = [None] * len(items)
        errors: list[str] = []
        num_done = [0]
        count(f"capacity-aware fit: {what}", 0, len(items))

        def done(out: TaskOutcome) -> None:
            if out.ok:
                values[out.index] = out.value
            else:
                errors.append(str(out.error))
            num_done[0] += 1
            count(f"capacity-aware fit: {what}", num_done[0], len(items))

        tasks = [(w, c.policy, c.params, caps[i].num_blocks) for i, w, c in items]
        if streamed:
            run_streamed(tasks, done, what)
        else:
            map_tasks(_simulate_task, tasks, shared, done, opts)
        if errors:
            raise KvtraceError(f"capacity-aware fit: {len(errors)} simulation(s) failed; first: {errors[0]}")
        return [{"capacity": caps[i].label, "capacity_blocks": caps[i].num_blocks, "window": w,
                 "candidate": c.label, "policy": c.policy, "params": dict(c.params), **v}
                for (i, w, c), v in zip(items, values, strict=True)]

    lru = Candidate("lru", {})
    lru_rows = run_round([(i, "train", lru) for i in range(len(caps))], "LRU on the train window")
    state = [CapacityTuning(cap, r["mean_eviction_age_s"] or max(choose_on.end_s - choose_on.start_s, 1.0),
                            [lru], [r]) for cap, r in zip(caps, lru_rows, strict=True)]
    items1 = [(i, "train", c) for i, t in enumerate(state) for c in first_round(t.age_s)[1:]]  # LRU is done
    for (i, _, c), r in zip(items1, run_round(items1, "round 1"), strict=True):
        state[i].add(c, r)
    items2 = [(i, "train", c) for i, t in enumerate(state) for c in second_round(t.best_wa(), t.age_s)]
    for (i, _, c), r in zip(items2, run_round(items2, "round 2"), strict=True):
        state[i].add(c, r)
    for t in state:
        t.choose(boot["train"])
    if test is not None:
        items = [(i, "test", c) for i, t in enumerate(state) for c in t.test_candidates()]
        for (i, _, _), r in zip(items, run_round(items, "the test window"), strict=True):
            state[i].test_rows.append(r)
        for t in state:
            t.check(boot["test"])
    rows = [r for t in state for r in t.train_rows] + [r for t in state for r in t.test_rows]
    for r in rows:
        r.pop("req_hit_blocks", None)
    return [t.choice() for t in state], rows


@dataclass
class CapacityTuning:
    """Everything tune learns at one capacity: LRU's mean eviction age there, the candidates and their rows
    (train window, in the same order; test window), the choice and its figures on both windows."""

    cap: Capacity
    age_s: float  # LRU's mean eviction age on the train window (scales WA's life windows)
    cands: list[Candidate]
    train_rows: list[dict[str, Any]]
    test_rows: list[dict[str, Any]] = field(default_factory=list)
    chosen: Candidate | None = None
    train: dict[str, Any] = field(default_factory=dict)  # the choice's figures where it was chosen
    test: dict[str, Any] = field(default_factory=dict)  # and on the test window

    def add(self, cand: Candidate, row: dict[str, Any]) -> None:
        """One more simulated candidate (train window)."""
        self.cands.append(cand)
        self.train_rows.append(row)

    def best_wa(self) -> Candidate:
        """The WA candidate with the most train hits (ties: the first)."""
        return self.cands[self._best([k for k, c in enumerate(self.cands) if c.policy == "wa"])]

    def _best(self, ks: list[int]) -> int:
        return max(ks, key=lambda k: (self.train_rows[k]["num_hits"], -k))

    def choose(self, boot: WindowBootstrap) -> None:
        """LRU, unless a candidate's gain over LRU is significant (BOOT's paired bootstrap of the train
        window): then, of the significant ones, the one with the highest lower bound."""
        gains = [boot.gain(r, self.train_rows[0]) for r in self.train_rows]
        ks = range(1, len(self.cands))
        significant = [k for k in ks if gains[k].significant]
        won = significant_best({str(k): gains[k] for k in ks})
        pick = 0 if won is None else int(won)
        best = max(ks, key=lambda k: (gains[k].point, -k)) if len(self.cands) > 1 else 0
        self.chosen = self.cands[pick]
        self._mark(self.train_rows)
        for r, g in zip(self.train_rows, gains, strict=True):
            r.update(gain_vs_lru_pp=g.point, gain_vs_lru_lo_pp=g.lo, gain_vs_lru_hi_pp=g.hi)
        self.train = _figures(self.train_rows, self.chosen) | boot.describe() | {
            "gain_vs_lru_pp": gains[pick].to_json(), "significant": pick != 0,
            "best_candidate": self.cands[best].label, "best_candidate_gain_vs_lru_pp": gains[best].to_json(),
            "num_significant": len(significant),
            "reason": choice_reason(self.cands[pick].label, gains[pick], self.cands[best].label, gains[best])}

    def _mark(self, rows: list[dict[str, Any]]) -> None:
        assert self.chosen is not None
        for r in rows:
            r.update(chosen=r["candidate"] == self.chosen.label, lru_eviction_age_s=self.age_s)

    def test_candidates(self) -> list[Candidate]:
        """What the test window simulates: the baselines and the choice."""
        assert self.chosen is not None
        nb = len(BASELINE_CANDIDATES)
        return self.cands[:nb] + ([self.chosen] if self.chosen.policy == "wa" else [])

    def check(self, boot: WindowBootstrap) -> None:
        """The choice's figures on the test window (its rows in test_rows), its gain over LRU with BOOT's
        interval."""
        assert self.chosen is not None
        self._mark(self.test_rows)
        by = {r["candidate"]: r for r in self.test_rows}
        gain = boot.gain(by[self.chosen.label], by["lru"])
        self.test = _figures(self.test_rows, self.chosen) | {"gain_vs_lru_pp": gain.to_json()}

    def choice(self) -> PolicyChoice:
        """The policy file's entry for this capacity."""
        c = self.chosen
        assert c is not None
        return PolicyChoice(capacity=self.cap.label, capacity_blocks=self.cap.num_blocks, policy=c.policy,
                            params={**c.params, **({"leaf_only": True} if c.policy == "wa" else {})},
                            train=self.train, test=self.test)


@dataclass(frozen=True)
class WindowBootstrap:
    """The paired block bootstrap (tongyi_trace.sim.bootstrap) over one window's requests."""

    resampler: Resampler
    refs: np.ndarray  # int64[N]: each request's block references
    grouping: str  # "sessions" or "time slices"

    @classmethod
    def of(cls, stream: Stream, sessions: np.ndarray, confidence: float,
           refs: np.ndarray | None = None) -> WindowBootstrap:
        """STREAM's requests grouped by their run's SESSIONS (session_id per req_idx), else by time slices;
        REFS: their block references (default: the stream's; a chunked stream's shape has none)."""
        res, grouping = stream_resampler(stream, sessions, confidence)
        return cls(res, np.diff(stream.req_off) if refs is None else refs, grouping)

    def gain(self, row: dict[str, Any], lru: dict[str, Any]) -> Interval:
        """ROW's hit-ratio gain over LRU's row, in points, with its interval."""
        return self.resampler.ratio_gain(row["req_hit_blocks"], lru["req_hit_blocks"], self.refs)

    def describe(self) -> dict[str, Any]:
        """How the intervals were made: confidence, resampling unit, groups and resamples."""
        r = self.resampler
        return {"confidence": r.confidence, "resampled": self.grouping, "num_groups": r.num_groups,
                "num_resamples": r.num_resamples}


def choice_reason(chosen: str, gain: Interval, best: str, best_gain: Interval) -> str:
    """Why CHOSEN runs: 'significant: ...' for a departure from LRU, else the best candidate BEST and why it
    was not taken ('s3fifo +0.05 +- 0.31: not significant')."""
    level = f"{100 * gain.confidence:g}%"
    if chosen != "lru":
        return f"{gain.text()} points over LRU, significant at {level} (lower bound {gain.lo:+.2f})"
    if best == "lru":
        return "no other candidate"
    if best_gain.point <= 0:
        return f"no candidate beats LRU (best: {best} {best_gain.text()} points)"
    return f"best candidate {best} {best_gain.text()} points: not significant at {level}"


def _figures(rows: list[dict[str, Any]], chosen: Candidate) -> dict[str, Any]:
    """Hit ratio of the choice, of LRU and of the best baseline in ROWS, and the gains (points of 1.0)."""
    by = {r["candidate"]: r for r in rows}
    hit = by[chosen.label]["hit_ratio"]
    lru = by["lru"]["hit_ratio"]
    base = max((by[b] for b in BASELINE_CANDIDATES if b in by), key=lambda r: r["hit_ratio"])
    return {"hit_ratio": hit, "lru_hit_ratio": lru, "gain_vs_lru": hit - lru,
            "best_baseline": base["candidate"], "best_baseline_hit_ratio": base["hit_ratio"],
            "gain_vs_best_baseline": hit - base["hit_ratio"], "num_refs": by["lru"]["num_refs"]}


def lru_gap_closed(hit: float, lru: float, oracle: float) -> float:
    """Share of the LRU-to-oracle gap that HIT closes (nan when there is no gap)."""
    gap = oracle - lru
    return (hit - lru) / gap if gap > 0 else math.nan
