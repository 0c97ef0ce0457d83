"""`kvtrace fit`: per-category reuse models -> the WA policy's hyperparameters (kvtrace.policy/2).

For each category w (`<type>-<turn bucket>` of the accessing request), every block access inside the
train window is a sample of the time until that block's next access, right-censored at the window end
(tongyi_trace.fit.events). F_w(d) = p_w (1 - exp(-lambda_w d)) is fitted by maximum likelihood
(tongyi_trace.policy.reuse_model); source: paper section 3 "Reuse time" (Fig 12-15) and section 4.2 (WA).

Fallback: a category with fewer than `min_samples` samples takes the pooled fit of all categories of
its type when that pool has enough samples, else the pooled fit over all categories (`default`), and is
flagged `fallback: true`. `default` is always the pool over all.

Lifespan regulator life_s (the `life` of ReuseProb_w(t, life)): unless given, the `life_quantile`
quantile of block lifespans in the train window, per pool: a block's lifespan is its last access minus
its first access inside the window (paper Fig 19-20: a block lives from its first access to its last
reuse), counted for blocks accessed at least twice there, in the category of their first access there.
Blocks never reused have no lifespan and are left out (they would pull every quantile to 0).

With a test window the same samples are built there: the KS distance of the policy's (train) F_w on
the test data, beside the test window's own fit: the paper's "similar hours look alike" (Fig 29).

Each category also carries its Kaplan-Meier CDF tabulated at wa_priority.km_grid_s() (the `km` model).
With capacities (default: DEFAULT_CAPACITIES), tongyi_trace.fit.tune chooses per capacity the setting
to run (WA variant or a baseline) on the train window and checks it on the test window.

Artifacts in RUN_DIR/fit/: policy.json (copy of the output), train_test.json (the per-category table),
cdf.parquet (fitted vs Kaplan-Meier CDF per category and window, for the report), tuning.parquet (every
candidate evaluated per capacity and window), workload.json (the workload summary `synth --like` reads).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tongyi_trace.artifact_set import commit_sets, staged
from tongyi_trace.budget import BASE_BYTES, MemoryBudget, resolve_budget
from tongyi_trace.errors import UsageError
from tongyi_trace.executor import DEFAULT_PARTITIONS, ExecutorOptions, PartitionOptions, check_options, check_partitions
from tongyi_trace.fit.events import (
    Window,
    block_lifespans,
    budget_partitions,
    load_accesses,
    parse_window,
    seconds_text,
    trace_span,
    window_samples,
)
from tongyi_trace.fit.synth_like import workload_summary
from tongyi_trace.fit.tune import DEFAULT_CAPACITIES, ProgressFn, tune
from tongyi_trace.models import ModelPreset
from tongyi_trace.policy.file import CategoryParams, PolicyParams, RequestContext, save_policy
from tongyi_trace.policy.reuse_model import ReuseFit, Samples, fit_reuse, km_curve, km_table, ks_distance, model_cdf
from tongyi_trace.run import check_not_run_table, open_run, write_json, write_parquet_atomic
from tongyi_trace.schemas import FIT_TABLE_SCHEMA
from tongyi_trace.sim.bootstrap import DEFAULT_CONFIDENCE, check_confidence
from tongyi_trace.sim.streamed import plan_fit
from tongyi_trace.trace.categories import follow_up_gaps_s

DEFAULT_MIN_SAMPLES = 1000
DEFAULT_LIFE_QUANTILE = 0.9
DEFAULT_HOLDOUT = 0.5  # the train window's end held out to choose the setting per capacity
CONTEXT_PARTS = ("gap", "pace")
CONTEXT_WORDS = ("auto", "none", *CONTEXT_PARTS)
CONTEXT_AUTO = ("gap", "pace")  # --context auto: each part the trace supports (docs/artifacts/fit.md: measured)
MIN_CONTEXT_GAPS = 1000  # follow-up turns in the train window below which --context auto fits none
GAP_SPLITS_S = (30.0, 120.0, 600.0)  # a follow-up's gap: a quick reply, typing, a return, back after a break
PACE_MIN_GAPS = 2  # a user's earlier follow-up turns needed before their pace class is known
_NUM_GRID = 120


@dataclass(frozen=True)
class FitOutcome:
    """What `fit_policy` produced: the policy, the per-category table and where things were written."""

    policy: PolicyParams
    rows: list[dict[str, Any]]
    policy_path: Path
    artifact_dir: Path
    train: Window
    test: Window | None
    memory: dict[str, Any] | None = None  # the capacity-aware step's plan: limit_gib, streamed, jobs, notes


def _category_params(fit: ReuseFit, samples: Samples, life_s: float, num_samples: int, ks: float,
                     fallback: bool) -> CategoryParams:
    return CategoryParams(reuse_prob=fit.reuse_prob, rate_per_s=fit.rate_per_s,
                          mean_reuse_s=fit.mean_reuse_s, life_s=life_s, num_samples=num_samples,
                          ks=ks, fallback=fallback, km_cdf=km_table(samples))


def _num(x: float) -> float | None:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def fit_policy(run_path: str | Path, out_path: str | Path, train: str | None = None,
               test: str | None = None, min_samples: int = DEFAULT_MIN_SAMPLES,
               life_quantile: float = DEFAULT_LIFE_QUANTILE, life_s: float | None = None,
               capacities: str | None = DEFAULT_CAPACITIES, model: ModelPreset | None = None, jobs: int = 0,
               executor: str = "local", ray_address: str | None = None, context: str = "auto",
               holdout: float = DEFAULT_HOLDOUT, confidence: float = DEFAULT_CONFIDENCE,
               partitions: int | None = None, on_step: Callable[[str], None] | None = None,
               on_progress: ProgressFn | None = None, budget: MemoryBudget | None = None) -> FitOutcome:
    """Fit every category of the run at RUN_PATH, choose a setting per capacity in CAPACITIES (None: no
    choice, WA's defaults), write the kvtrace.policy/2 file OUT_PATH and the artifacts in RUN_DIR/fit/.
    TRAIN/TEST are "START:END" windows in seconds (train defaults to the whole trace). ON_STEP names each
    step; ON_PROGRESS counts the categories fitted and the candidate simulations against their number.
    CONTEXT: the context classes appended to the categories (fit_context): "none", "gap", "pace", "gap,pace",
    or "auto" (those the train window supports). HOLDOUT: the share of the train window (its end) on which
    the setting per capacity is chosen, with parameters fitted on the rest (0: chosen on the whole train
    window with its own parameters, in-sample); the file's parameters are fitted on the whole window.
    PARTITIONS: link the block accesses in that many partitions on the executor (default with executor "ray":
    DEFAULT_PARTITIONS; locally none), the same accesses (fit/events.py). BUDGET: the memory budget
    (--memory-limit-gib; None: the default) that plans the capacity-aware step (sim/streamed.py's plan_fit:
    the whole stream with JOBS lowered to what it holds, or streamed), recorded in train_test.json's `memory`."""
    opts = check_options(ExecutorOptions(executor, ray_address, jobs))  # --executor, --ray-address, --jobs
    split = (PartitionOptions(opts, check_partitions(partitions if partitions is not None else DEFAULT_PARTITIONS))
             if partitions is not None or opts.kind == "ray" else None)
    check_not_run_table(Path(out_path), "-o")
    if min_samples < 1:
        raise UsageError(f"--min-samples {min_samples}: must be at least 1")
    if not 0.0 <= life_quantile <= 1.0:
        raise UsageError(f"--life-quantile {life_quantile}: must be within [0, 1]")
    if life_s is not None and (not math.isfinite(life_s) or life_s < 0):
        raise UsageError(f"--life-s {life_s}: must be a finite number of seconds >= 0")
    check_confidence(confidence)
    if not 0.0 <= holdout <= 0.9:
        raise UsageError(f"--holdout {holdout}: must be within [0, 0.9] (the share of the train window)")
    step = on_step or (lambda _msg: None)
    count = on_progress or (lambda _what, _done, _total: None)
    run = open_run(run_path)
    with run.lock():
        prov = run.provenance()
        requests = run.requests()
        arrival_s = requests["arrival_s"].to_numpy()
        start_s = float(arrival_s.min()) if requests.height else 0.0  # windows count from here
        trace_end_s = max(float(arrival_s.max()) if requests.height else 0.0,
                          start_s + float(prov.get("duration_s") or 0.0))
        train_w = (parse_window(train, start_s, trace_end_s, "--train") if train
                   else Window(start_s, trace_end_s, True, start_s))
        test_w = parse_window(test, start_s, trace_end_s, "--test") if test else None
        ctx = fit_context(requests, train_w, context)
        del requests  # only arrival_s from here: a 100x run's frame holds ~0.5 GB through the simulations
        budget = budget or resolve_budget(None)
        if split is None:  # a run too large to link at once: partitions of the chains, one at a time, here
            num = budget_partitions(int(prov.get("num_block_refs") or 0), budget.limit_bytes - BASE_BYTES)
            split = PartitionOptions(ExecutorOptions("local", None, 1), num) if num > 1 else None
        step(f"linking block accesses{f' in {split.num_partitions} partitions' if split else ''}")
        acc = load_accesses(run.tables(), ctx, split)

        step("fitting the train window")
        train_fits = _own_fits(_nonempty(window_samples(acc, train_w), train_w, trace_end_s, "--train"),
                               lambda done, total: count("fitting categories (train window)", done, total))
        lifes = block_lifespans(acc, train_w)
        policy_cats, rows, default = _fit_categories(train_fits, acc.category_type, lifes, min_samples,
                                                     life_quantile, life_s)
        del lifes  # 8 bytes a reused block (0.8 GB at 100x), not held through the simulations
        test_fits: dict[str, tuple[Samples, ReuseFit]] = {}
        if test_w is not None:
            step("checking on the test window")
            test_fits = _own_fits(_nonempty(window_samples(acc, test_w), test_w, trace_end_s, "--test"),
                                  lambda done, total: count("fitting categories (test window)", done, total))
            _add_test_columns(rows, test_fits, policy_cats, default)

        policy = PolicyParams(
            categories=policy_cats,
            default=default,
            trace={k: prov.get(k) for k in ("source", "sha256", "format", "block_size", "run_id")},
            window=train_w.to_json() | {"trace_end_s": trace_end_s - start_s},
            turn_buckets=[int(b) for b in prov.get("turn_buckets") or [1, 2, 3]],
            context=ctx,
        )
        fit_dir = run.path / "fit"
        tune_rows: list[dict[str, Any]] | None = None
        memory: dict[str, Any] | None = None
        if capacities:
            plan = plan_fit(run.path, jobs, budget, streamable=opts.kind == "local")
            memory = {"limit_gib": budget.limit_gib, "streamed": plan.streamed, "jobs": plan.jobs,
                      "notes": list(plan.notes)}
            select = None
            if holdout > 0:
                step("fitting the train window without its held-out end")
                cut_s = train_w.start_s + (1.0 - holdout) * (train_w.end_s - train_w.start_s)
                part_w = Window(train_w.start_s, cut_s, origin_s=start_s)
                held_w = Window(cut_s, train_w.end_s, train_w.include_end, start_s)
                if held_w.start_s > trace_end_s:  # the train window reaches far past the trace's end
                    raise UsageError(
                        f"--train {train}: ends past the trace's end ({trace_span(trace_end_s - start_s)}), "
                        f"so the held-out end of the train window ({held_w} s) holds no request; give --train "
                        f"a window within 0:{seconds_text(trace_end_s - start_s)} (START: runs to the end)")
                _nonempty(window_samples(acc, held_w), held_w, trace_end_s, "--holdout",
                          f"--holdout {holdout:g}: the held-out end of the train window "
                          f"({held_w} s, where the setting per capacity is chosen)")
                part = _own_fits(_nonempty(window_samples(acc, part_w), part_w, trace_end_s, "--holdout",
                                           f"--holdout {holdout:g}: the part of the train window before its held-out "
                                           f"end ({part_w} s)"),
                                 lambda done, total: count("fitting categories (held-out choice)", done, total))
                cats, _, dflt = _fit_categories(part, acc.category_type, block_lifespans(acc, part_w), min_samples,
                                                life_quantile, life_s)
                select = (replace(policy, categories=cats, default=dflt, window=part_w.to_json()), held_w)
            del acc  # the linked accesses (8 bytes a reference) are not needed by the simulations
            choices, tune_rows = tune(run, policy, train_w, test_w, capacities, model=model, on_step=step,
                                      on_progress=on_progress, select=select, confidence=confidence,
                                      executor=ExecutorOptions(executor, ray_address,
                                                               jobs if plan.streamed else plan.jobs),
                                      plan=plan, budget=budget)
            policy = replace(policy, choices=choices)
        step("writing the policy and artifacts")
        out = Path(out_path)
        if out.resolve() != (fit_dir / "policy.json").resolve():
            save_policy(policy, out)
        with staged(run.path) as stage:  # the new set of RUN/fit/, committed as one step
            if tune_rows is not None:
                write_parquet_atomic(pl.DataFrame([{**r, "params": json.dumps(r["params"])} for r in tune_rows]),
                                     stage / "tuning.parquet")
            save_policy(policy, stage / "policy.json")
            whole = not plan_fit(run.path, jobs, budget).streamed  # the twin model holds the whole stream
            if not whole:
                note = ("workload.json has no twin model (learning it holds the whole stream): `kvtrace synth "
                        "--like` needs a fit with a larger --memory-limit-gib")
                memory = {**(memory or {"limit_gib": budget.limit_gib, "streamed": True, "jobs": 1, "notes": []})}
                memory["notes"] = [*memory["notes"], note]
            write_json(stage / "workload.json", workload_summary(run.tables(), twin=whole))
            write_json(stage / "train_test.json", {
                "schema": FIT_TABLE_SCHEMA,
                "train": train_w.to_json(),
                "test": test_w.to_json() if test_w else None,
                "options": {"min_samples": min_samples, "life_quantile": life_quantile, "life_s": life_s,
                            "capacities": capacities, "context": context, "holdout": holdout,
                            "confidence": confidence},
                "memory": memory,
                "rows": rows,
            })
            write_parquet_atomic(_cdf_table(train_fits, test_fits, policy_cats, default, train_w, test_w),
                                 stage / "cdf.parquet")
            commit_sets(run.path, [(stage, fit_dir)], "fit", prov.get("run_id"))
        return FitOutcome(policy, rows, out, fit_dir, train_w, test_w, memory)


def fit_context(requests: pl.DataFrame, train: Window, spec: str) -> RequestContext | None:
    """The context classes of the categories (`--context`, see fit_policy) on the train window's requests:
    gap classes split at GAP_SPLITS_S, the pace class split at the median follow-up gap; None when none."""
    words = [w.strip() for w in spec.lower().split(",") if w.strip()]
    if not words or any(w not in CONTEXT_WORDS for w in words) or (len(words) > 1 and {"auto", "none"} & set(words)):
        raise UsageError(f"--context {spec!r}: give auto, none, or a comma-separated list of "
                         f"{', '.join(CONTEXT_PARTS)}")
    if words == ["none"]:
        return None
    reqs = requests.filter(pl.Series(train.contains(requests["arrival_s"].to_numpy())))
    gaps = follow_up_gaps_s(reqs)
    has_users = bool(reqs["user_id"].is_not_null().any())
    parts = set(CONTEXT_AUTO if words == ["auto"] else words)
    if words == ["auto"] and len(gaps) < MIN_CONTEXT_GAPS:
        return None
    if len(gaps) == 0:
        raise UsageError(f"--context {spec}: the train window has no follow-up turn (parent_chat_id), which "
                         "context classes need (use auto or none)")
    if "pace" in parts and not has_users:
        if words != ["auto"]:
            raise UsageError(f"--context {spec}: the trace has no user ids, which the pace class needs "
                             "(use gap, auto or none)")
        parts.discard("pace")
    return RequestContext(gap_splits_s=GAP_SPLITS_S if "gap" in parts else (),
                          pace_split_s=float(np.median(gaps)) if "pace" in parts else None,
                          pace_min_gaps=PACE_MIN_GAPS)


def _nonempty(samples: dict[str, Samples], w: Window, trace_end_s: float, option: str,
              what: str | None = None) -> dict[str, Samples]:
    """SAMPLES, or a one-line UsageError naming OPTION (WHAT: the window as the user gave it) when empty."""
    if not samples:
        span = trace_span(trace_end_s - w.origin_s)
        fix = ("use --holdout 0 or a longer train window" if option == "--holdout"
               else f"give {option} a window inside the trace")
        raise UsageError(f"{what or f'{option} {w}'}: no block access in this window ({span}); {fix}")
    return samples



def _own_fits(by_cat: dict[str, Samples], fitted: Callable[[int, int], None]
              ) -> dict[str, tuple[Samples, ReuseFit]]:
    """Each category's samples with its own fit, plus "default": all categories pooled; FITTED(done, total)
    after each fit."""
    named = {**by_cat, "default": Samples.concat(list(by_cat.values()))}
    fits: dict[str, tuple[Samples, ReuseFit]] = {}
    fitted(0, len(named))
    for name, samples in named.items():
        fits[name] = (samples, fit_reuse(samples))
        fitted(len(fits), len(named))
    return fits


def _fit_categories(fits: dict[str, tuple[Samples, ReuseFit]], types: dict[str, str | None],
                    life_by_cat: dict[str, np.ndarray], min_samples: int, life_quantile: float,
                    life_s: float | None,
                    ) -> tuple[dict[str, CategoryParams], list[dict[str, Any]], CategoryParams]:
    empty = np.empty(0)
    all_lifes = np.concatenate([empty, *life_by_cat.values()])  # a copy: its quantile may reorder it

    def life_of(lifespans_s: np.ndarray, own: bool = False) -> float:
        """The life_quantile of LIFESPANS_S (OWN: a copy of ours, which the quantile may reorder, so that a
        100x run's lifespans are not copied again), else of all lifespans."""
        if life_s is not None:
            return life_s
        for values, mine in ((lifespans_s, own), (all_lifes, True)):
            if len(values):
                return float(np.quantile(values, life_quantile, overwrite_input=mine))
        return 0.0

    # pool name -> (fit, life_s): "all", "type:<t>"
    all_samples, all_fit = fits["default"]
    pools: dict[str, tuple[ReuseFit, Samples, float]] = {"all": (all_fit, all_samples, life_of(all_lifes, True))}
    for t in sorted({t for t in types.values() if t is not None}):
        members = [c for c in fits if c != "default" and types.get(c) == t]
        samples = Samples.concat([fits[c][0] for c in members])
        if samples.num_samples >= min_samples:
            lifespans = np.concatenate([life_by_cat.get(c, empty) for c in members])
            pools[f"type:{t}"] = (fit_reuse(samples), samples, life_of(lifespans, True))
            del lifespans

    cats: dict[str, CategoryParams] = {}
    rows: list[dict[str, Any]] = []
    for name in sorted(c for c in fits if c != "default"):
        samples, own = fits[name]
        if samples.num_samples >= min_samples:
            pool, used, used_samples, life = "own", own, samples, life_of(life_by_cat.get(name, empty))
        else:
            pool = f"type:{types.get(name)}" if f"type:{types.get(name)}" in pools else "all"
            used, used_samples, life = pools[pool]
        ks = own.ks if pool == "own" else ks_distance(samples, used.reuse_prob, used.rate_per_s)
        cats[name] = _category_params(used, used_samples, life, samples.num_samples, ks, pool != "own")
        rows.append(_row(name, types.get(name), pool, cats[name], own))
    default = _category_params(all_fit, all_samples, pools["all"][2], all_samples.num_samples, all_fit.ks,
                               all_samples.num_samples < min_samples)
    rows.append(_row("default", None, "all", default, all_fit))
    return cats, rows, default


def _row(name: str, type_: str | None, pool: str, params: CategoryParams, own: ReuseFit) -> dict[str, Any]:
    return {
        "category": name, "type": type_, "pool": pool, "fallback": params.fallback,
        "reuse_prob": params.reuse_prob, "rate_per_s": params.rate_per_s,
        "mean_reuse_s": _num(params.mean_reuse_s), "life_s": params.life_s,
        "train_num_samples": own.num_samples, "train_num_observed": own.num_observed,
        "train_ks": _num(params.ks),
        "own_reuse_prob": own.reuse_prob, "own_rate_per_s": own.rate_per_s,
        "own_mean_reuse_s": _num(own.mean_reuse_s), "own_ks": _num(own.ks),
        "test_num_samples": None, "test_num_observed": None, "test_reuse_prob": None,
        "test_rate_per_s": None, "test_mean_reuse_s": None, "test_ks_own": None, "test_ks_policy": None,
    }


def _add_test_columns(rows: list[dict[str, Any]], test_fits: dict[str, tuple[Samples, ReuseFit]],
                      cats: dict[str, CategoryParams], default: CategoryParams) -> None:
    listed = {r["category"] for r in rows}
    for name in sorted(set(test_fits) - listed):  # categories seen only in the test window
        rows.insert(-1, dict.fromkeys(rows[-1]) | {"category": name, "pool": "all"})
    for row in rows:
        name = row["category"]
        if name not in test_fits:
            continue
        samples, own = test_fits[name]
        params = default if name == "default" else cats.get(name, default)
        row.update({
            "test_num_samples": own.num_samples, "test_num_observed": own.num_observed,
            "test_reuse_prob": own.reuse_prob, "test_rate_per_s": own.rate_per_s,
            "test_mean_reuse_s": _num(own.mean_reuse_s), "test_ks_own": _num(own.ks),
            "test_ks_policy": _num(ks_distance(samples, params.reuse_prob, params.rate_per_s)),
        })


def _cdf_table(train: dict[str, tuple[Samples, ReuseFit]], test: dict[str, tuple[Samples, ReuseFit]],
               cats: dict[str, CategoryParams], default: CategoryParams, train_w: Window,
               test_w: Window | None) -> pl.DataFrame:
    frames = []
    for label, fits, w in (("train", train, train_w), ("test", test, test_w)):
        if w is None:
            continue
        grid = np.concatenate([[0.0], np.geomspace(1e-2, max(w.end_s - w.start_s, 1e-2), _NUM_GRID)])
        for name, (samples, own) in sorted(fits.items()):
            params = default if name == "default" else cats.get(name, default)
            frames.append(pl.DataFrame({
                "category": name, "window": label, "d_s": grid,
                "empirical_cdf": km_curve(samples, grid),
                "fitted_cdf": model_cdf(own.reuse_prob, own.rate_per_s, grid),
                "policy_cdf": model_cdf(params.reuse_prob, params.rate_per_s, grid),
            }))
    return pl.concat(frames)
