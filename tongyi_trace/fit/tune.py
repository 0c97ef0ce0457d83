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

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from tongyi_trace.errors import UsageError
from tongyi_trace.fit.events import Window
from tongyi_trace.fit.params import PolicyChoice, PolicyParams
from tongyi_trace.models import ModelPreset
from tongyi_trace.run import RunDir
from tongyi_trace.sim.capacity import parse_capacities, peak_live_blocks
from tongyi_trace.sim.simulate import simulate_policy
from tongyi_trace.sim.stream import Stream, load_stream, next_request_of_refs

DEFAULT_CAPACITIES = "1L"
NUM_SLICES = 10
SIGNIFICANCE = 2.0
LIFE_FACTORS = (0.05, 0.25, 1.0)
BASELINE_CANDIDATES = ("lru", "fifo", "s3fifo")


@dataclass(frozen=True)
class Candidate:
    """One setting: a policy and its parameters."""

    policy: str
    params: dict[str, Any]

    @property
    def label(self) -> str:
        """e.g. 'wa model=km conditional=True life_s=12.5' or 'lru'."""
        if not self.params:
            return self.policy
        return self.policy + " " + " ".join(f"{k}={_short(v)}" for k, v in self.params.items())


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


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


def window_stream(run: RunDir, w: Window) -> Stream:
    """The run's requests that arrive inside window W, as a stream (cold cache at W's start)."""
    reqs = run.requests().select("req_idx", "arrival_s")
    t = reqs["arrival_s"].to_numpy()
    idx = reqs["req_idx"].to_numpy()[w.contains(t)]
    return load_stream(run, np.sort(idx).astype(np.int64))


def tune(run: RunDir, policy: PolicyParams, train: Window, test: Window | None, capacities: str, *,
         model: ModelPreset | None = None, jobs: int = 0,
         on_step: Callable[[str], None] | None = None) -> tuple[list[PolicyChoice], list[dict[str, Any]]]:
    """Choose a setting per capacity on TRAIN, check it on TEST; returns (choices, every evaluated row)."""
    step = on_step or (lambda _msg: None)
    full = load_stream(run)
    if full.num_refs == 0:
        raise UsageError(f"{run.path}: no block references; nothing to tune")
    nxt = next_request_of_refs(full.req_off, full.blk, full.num_ids)
    caps = parse_capacities(capacities, num_distinct=full.num_ids, block_size_tokens=full.block_size,
                            model=model, peak_live=int(peak_live_blocks(full.req_off, nxt)))
    del full, nxt
    train_s = window_stream(run, train)
    test_s = window_stream(run, test) if test is not None else None
    workers = jobs if jobs > 0 else 2
    rows: list[dict[str, Any]] = []
    choices: list[PolicyChoice] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:

        hits_of: dict[str, np.ndarray] = {}  # candidate label -> hit blocks per request (train window)

        def run_all(stream: Stream, cands: list[Candidate], label: str, blocks: int,
                    window: str) -> list[dict[str, Any]]:
            futs = [pool.submit(simulate_policy, stream, c.policy, blocks, params=dict(c.params), fit=policy,
                                timing=False) for c in cands]
            out = []
            for c, f in zip(cands, futs, strict=True):
                r = f.result()
                if window == "train":
                    hits_of[c.label] = r.req_hit_blocks
                out.append({"capacity": label, "capacity_blocks": blocks, "window": window,
                            "candidate": c.label, "policy": c.policy, "params": dict(c.params),
                            "hit_ratio": r.hit_ratio, "num_hits": r.num_hits, "num_refs": r.num_refs,
                            "mean_eviction_age_s": r.mean_eviction_age_s, "orphaned_refs": r.orphaned_refs})
            return out

        for i, cap in enumerate(caps):
            step(f"tuning at {cap.label} ({i + 1}/{len(caps)}): train window")
            lru_row = run_all(train_s, [Candidate("lru", {})], cap.label, cap.num_blocks, "train")[0]
            age_s = lru_row["mean_eviction_age_s"] or max(train.end_s - train.start_s, 1.0)
            cands = first_round(age_s)
            train_rows = [lru_row, *run_all(train_s, cands[1:], cap.label, cap.num_blocks, "train")]
            best_wa = max((k for k in range(len(cands)) if cands[k].policy == "wa"),
                          key=lambda k: (train_rows[k]["num_hits"], -k))
            more = second_round(cands[best_wa], age_s)
            cands += more
            train_rows += run_all(train_s, more, cap.label, cap.num_blocks, "train")
            nb = len(BASELINE_CANDIDATES)
            base = max(range(nb), key=lambda k: (train_rows[k]["num_hits"], -k))
            best_wa = max(range(nb, len(cands)), key=lambda k: (train_rows[k]["num_hits"], -k))
            z = significance(hits_of[cands[best_wa].label], hits_of[cands[base].label])
            chosen = cands[best_wa] if z >= SIGNIFICANCE else cands[base]
            hits_of.clear()
            for r in train_rows:
                r["chosen"] = r["candidate"] == chosen.label
                r["lru_eviction_age_s"] = age_s
            rows += train_rows
            tr = _figures(train_rows, chosen) | {"best_wa": cands[best_wa].label, "best_wa_z": z}
            te: dict[str, Any] = {}
            if test_s is not None:
                step(f"tuning at {cap.label} ({i + 1}/{len(caps)}): test window")
                check = cands[:len(BASELINE_CANDIDATES)] + ([chosen] if chosen.policy == "wa" else [])
                test_rows = run_all(test_s, check, cap.label, cap.num_blocks, "test")
                for r in test_rows:
                    r["chosen"] = r["candidate"] == chosen.label
                    r["lru_eviction_age_s"] = age_s
                rows += test_rows
                te = _figures(test_rows, chosen)
            choices.append(PolicyChoice(capacity=cap.label, capacity_blocks=cap.num_blocks, policy=chosen.policy,
                                        params={**chosen.params, **({"leaf_only": True} if chosen.policy == "wa"
                                                                    else {})},
                                        train=tr, test=te))
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
