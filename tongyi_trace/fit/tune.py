"""Capacity-aware fitting (`kvtrace fit --capacity`): which policy setting to run at each cache size.

For each capacity, every candidate is simulated on the train window (a cold cache at the window start,
the run's requests in arrival order). The best baseline is the plugin-runnable baseline (LRU, FIFO,
S3-FIFO) with the most block hits (ties: in that order). The best WA setting replaces it only when its
gain is significant: at least SIGNIFICANCE standard errors, the error estimated from the gain's spread
over NUM_SLICES consecutive slices of the train window (a setting that wins by noise on one hour loses
by noise on the next). So the choice never loses to a baseline on the data it was chosen on, and a WA
choice has beaten the best baseline by more than its own noise there. The choice, LRU and the other baselines are
then simulated on the test window, and the file records both gains over LRU: the honest figure is the
test one.

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
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tongyi_trace.errors import KvtraceError, UsageError
from tongyi_trace.executor import ExecutorOptions, TaskOutcome, map_tasks, sized_for
from tongyi_trace.fit.events import Window
from tongyi_trace.models import ModelPreset
from tongyi_trace.policy.file import PolicyChoice, PolicyParams, RequestContext, setting_label
from tongyi_trace.policy.names import PLUGIN_BASELINES as BASELINE_CANDIDATES
from tongyi_trace.run import RunDir
from tongyi_trace.sim.capacity import parse_capacities, peak_live_blocks
from tongyi_trace.sim.simulate import simulate_policy
from tongyi_trace.sim.stream import Stream, load_stream, next_request_of_refs

DEFAULT_CAPACITIES = "1L"
ProgressFn = Callable[[str, int, int], None]  # (what, done, total): a count of the work of one phase
NUM_SLICES = 10
SIGNIFICANCE = 2.0
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


def window_stream(run: RunDir, w: Window, context: RequestContext | None = None) -> Stream:
    """The run's requests that arrive inside window W, as a stream (cold cache at W's start), categories
    as a policy fitted with CONTEXT sees them."""
    reqs = run.requests().select("req_idx", "arrival_s")
    t = reqs["arrival_s"].to_numpy()
    idx = reqs["req_idx"].to_numpy()[w.contains(t)]
    return load_stream(run, np.sort(idx).astype(np.int64), context)


_STREAMS: dict[str, Stream] = {}  # "<tune id>.<window>" -> the stream rebuilt over the shared arrays


def _simulate_task(task: tuple[str, str, dict[str, Any], int], shared: Mapping[str, Any]) -> dict[str, Any]:
    """One candidate at one capacity on one window (runs in an executor's worker)."""
    window, pol, params, blocks = task
    key = f"{shared['tune_id']}.{window}"
    if key not in _STREAMS:
        for old in [k for k in _STREAMS if not k.startswith(f"{shared['tune_id']}.")]:
            del _STREAMS[old]
        _STREAMS[key] = Stream(**{k.split(".", 1)[1]: v for k, v in shared.items() if k.startswith(f"{window}.")})
    fit = shared[f"fit.{window}"]
    r = simulate_policy(_STREAMS[key], pol, blocks, params=dict(params), fit=fit, timing=False)
    return {"hit_ratio": r.hit_ratio, "num_hits": r.num_hits, "num_refs": r.num_refs,
            "mean_eviction_age_s": r.mean_eviction_age_s, "orphaned_refs": r.orphaned_refs,
            "req_hit_blocks": r.req_hit_blocks if window == "train" else None}


def tune(run: RunDir, policy: PolicyParams, train: Window, test: Window | None, capacities: str, *,
         model: ModelPreset | None = None, executor: ExecutorOptions | None = None,
         on_step: Callable[[str], None] | None = None, on_progress: ProgressFn | None = None,
         select: tuple[PolicyParams, Window] | None = None) -> tuple[list[PolicyChoice], list[dict[str, Any]]]:
    """Choose a setting per capacity on TRAIN with POLICY, check it on TEST; returns (choices, every
    evaluated row). SELECT = (a policy fitted on part of TRAIN, the held-out rest of TRAIN): choose there
    instead, with that policy (rows of window "train" are then the held-out part's), so the choice is made
    on requests its parameters have not seen. The simulations of each round run on EXECUTOR
    (tongyi_trace.executor: the local pool or Ray); ON_PROGRESS counts them, round by round."""
    step = on_step or (lambda _msg: None)
    count = on_progress or (lambda _what, _done, _total: None)
    full = load_stream(run)
    if full.num_refs == 0:
        raise UsageError(f"{run.path}: no block references; nothing to tune")
    nxt = next_request_of_refs(full.req_off, full.blk, full.num_ids)
    caps = parse_capacities(capacities, num_distinct=full.num_ids, block_size_tokens=full.block_size,
                            model=model, peak_live=int(peak_live_blocks(full.req_off, nxt)))
    del full, nxt
    choose_with, choose_on = select if select is not None else (policy, train)
    windows = {"train": window_stream(run, choose_on, policy.context)}
    if test is not None:
        windows["test"] = window_stream(run, test, policy.context)
    shared: dict[str, Any] = {f"{w}.{f.name}": getattr(st, f.name) for w, st in windows.items()
                              for f in dataclasses.fields(st)}
    shared.update({"fit.train": choose_with, "fit.test": policy, "tune_id": uuid.uuid4().hex})
    opts = sized_for(executor or ExecutorOptions(), windows["train"].num_refs)

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

        map_tasks(_simulate_task, [(w, c.policy, c.params, caps[i].num_blocks) for i, w, c in items], shared,
                  done, opts)
        if errors:
            raise KvtraceError(f"capacity-aware fit: {len(errors)} simulation(s) failed; first: {errors[0]}")
        return [{"capacity": caps[i].label, "capacity_blocks": caps[i].num_blocks, "window": w,
                 "candidate": c.label, "policy": c.policy, "params": dict(c.params), **v}
                for (i, w, c), v in zip(items, values, strict=True)]

    lru = Candidate("lru", {})
    lru_rows = run_round([(i, "train", lru) for i in range(len(caps))], "LRU on the train window")
    ages = [r["mean_eviction_age_s"] or max(choose_on.end_s - choose_on.start_s, 1.0) for r in lru_rows]
    first = [first_round(a)[1:] for a in ages]  # LRU is done
    items1 = [(i, "train", c) for i in range(len(caps)) for c in first[i]]
    per_cap: list[list[dict[str, Any]]] = [[lru_rows[i]] for i in range(len(caps))]
    cands: list[list[Candidate]] = [[lru, *first[i]] for i in range(len(caps))]
    for (i, _, _), r in zip(items1, run_round(items1, "round 1"), strict=True):
        per_cap[i].append(r)
    second: list[list[Candidate]] = []
    for i in range(len(caps)):
        k = max((k for k in range(len(cands[i])) if cands[i][k].policy == "wa"),
                key=lambda k: (per_cap[i][k]["num_hits"], -k))
        second.append(second_round(cands[i][k], ages[i]))
    items2 = [(i, "train", c) for i in range(len(caps)) for c in second[i]]
    for (i, _, c), r in zip(items2, run_round(items2, "round 2"), strict=True):
        per_cap[i].append(r)
        cands[i].append(c)

    rows: list[dict[str, Any]] = []
    chosen: list[Candidate] = []
    figures: list[dict[str, Any]] = []
    nb = len(BASELINE_CANDIDATES)
    for i in range(len(caps)):
        train_rows = per_cap[i]
        base = max(range(nb), key=lambda k: (train_rows[k]["num_hits"], -k))
        best_wa = max(range(nb, len(cands[i])), key=lambda k: (train_rows[k]["num_hits"], -k))
        z = significance(train_rows[best_wa]["req_hit_blocks"], train_rows[base]["req_hit_blocks"])
        pick = cands[i][best_wa] if z >= SIGNIFICANCE else cands[i][base]
        chosen.append(pick)
        for r in train_rows:
            r.update(chosen=r["candidate"] == pick.label, lru_eviction_age_s=ages[i])
        figures.append(_figures(train_rows, pick) | {"best_wa": cands[i][best_wa].label, "best_wa_z": z})
        rows += train_rows
    tests: list[dict[str, Any]] = [{} for _ in caps]
    if test is not None:
        items = [(i, "test", c) for i in range(len(caps))
                 for c in cands[i][:nb] + ([chosen[i]] if chosen[i].policy == "wa" else [])]
        test_rows = run_round(items, "the test window")
        for i in range(len(caps)):
            mine = [r for (j, _, _), r in zip(items, test_rows, strict=True) if j == i]
            for r in mine:
                r.update(chosen=r["candidate"] == chosen[i].label, lru_eviction_age_s=ages[i])
            tests[i] = _figures(mine, chosen[i])
            rows += mine
    for r in rows:
        r.pop("req_hit_blocks", None)
    choices = [PolicyChoice(capacity=cap.label, capacity_blocks=cap.num_blocks, policy=c.policy,
                            params={**c.params, **({"leaf_only": True} if c.policy == "wa" else {})},
                            train=tr, test=te)
               for cap, c, tr, te in zip(caps, chosen, figures, tests, strict=True)]
    return choices, rows


def significance(hits_a: np.ndarray, hits_b: np.ndarray, num_slices: int = NUM_SLICES) -> float:
    """How many standard errors A's extra hits over B's are: the per-request differences summed over
    NUM_SLICES consecutive slices of the requests, total over (sqrt(slices) x the slices' std). +inf when A
    gains in every slice alike (no spread), 0 when it gains nothing."""
    d = np.asarray(hits_a, np.float64) - np.asarray(hits_b, np.float64)
    total = float(d.sum())
    if total <= 0 or d.size < num_slices:
        return 0.0 if total <= 0 else math.inf
    per = np.array([s.sum() for s in np.array_split(d, num_slices)])
    spread = float(per.std(ddof=1)) * math.sqrt(num_slices)
    return total / spread if spread > 0 else math.inf


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
