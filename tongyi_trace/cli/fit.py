"""`kvtrace fit`: per-category reuse models and the setting to run per capacity -> kvtrace.policy/2."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from tongyi_trace.budget import name_step, resolve_budget
from tongyi_trace.cli import app, source_value
from tongyi_trace.cli._common import abs_path, console, print_json, progress, run_cli, run_or_trace, say
from tongyi_trace.models import DEFAULT_MODEL

if TYPE_CHECKING:
    from rich.table import Table

    from tongyi_trace.fit.policy_fit import FitOutcome


@app.command()
def fit(
    run_dir: Path = typer.Argument(..., help="Run folder written by 'kvtrace ingest', or a raw trace (ingested "
                                   "first into ./<trace name>.kvtrace)."),
    output: Path | None = typer.Option(None, "-o", "--out", "--output",
                                       help="Policy file to write (default: RUN_DIR/fit/policy.json)."),
    train: str | None = typer.Option(None, "--train", metavar="START:END",
                                     help="Fit window, seconds from the trace start (default: all)."),
    test: str | None = typer.Option(None, "--test", metavar="START:END",
                                    help="Held-out window: KS of the train fit on it, beside its own fit."),
    min_samples: int = typer.Option(source_value("fit.policy_fit", "DEFAULT_MIN_SAMPLES"), "--min-samples",
                                    help="Below this many samples a category takes its type's pooled fit, "
                                         "then the fit over all."),
    life_quantile: float = typer.Option(source_value("fit.policy_fit", "DEFAULT_LIFE_QUANTILE"), "--life-quantile",
                                        help="life_s = this quantile of block lifespans (train window)."),
    life_s: float | None = typer.Option(None, "--life-s", help="Use this life_s (s) for every category."),
    capacity: str = typer.Option(source_value("fit.tune", "DEFAULT_CAPACITIES"), "--capacity", "-c",
                                 help="Choose the setting to run at each of these cache sizes (blocks, N%, Nx "
                                      "HBM of --model, NL x the oracle's peak live set, 40GiB); 'none': no choice."),
    model: str | None = typer.Option(None, "--model", help="Model preset or Hugging Face config.json path "
                                     "(x HBM and byte capacities; default: the model the run was last sized with, "
                                     f"else {DEFAULT_MODEL})."),
    jobs: int = typer.Option(0, "--jobs", "-j", help="Simulations at once while choosing (0 = one per core)."),
    executor: str = typer.Option("local", "--executor", help="local (process pool) or ray (a Ray cluster) for the "
                                 "simulations of the capacity-aware choice, and for linking the block accesses "
                                 "in partitions by a hash of the chained block id."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Ray cluster address (--executor ray; "
                                           "default $RAY_ADDRESS, else a local Ray instance)."),
    partitions: int | None = typer.Option(None, "--partitions", help="Partitions of the linking of block accesses, "
                                          "one task each (default with --executor ray: 16; locally: none)."),
    context: str = typer.Option("auto", "--context", help="Context classes appended to WA's categories: gap (a "
                                "follow-up's gap to its previous turn), pace (the user's pace so far), a list "
                                "(gap,pace), none, or auto (what the trace supports)."),
    holdout: float = typer.Option(source_value("fit.policy_fit", "DEFAULT_HOLDOUT"), "--holdout",
                                  help="Share of the train window (its end) on which the setting per capacity "
                                       "is chosen, with parameters fitted on the rest (0: in-sample)."),
    confidence: float = typer.Option(source_value("sim.bootstrap", "DEFAULT_CONFIDENCE"), "--confidence",
                                     help="Run another setting than LRU at a capacity only when its gain over "
                                          "LRU is significant at this level (block bootstrap over sessions)."),
    memory_limit_gib: float | None = typer.Option(None, "--memory-limit-gib",
                                                  help="Memory budget of the whole process, GiB (default: a "
                                                       "quarter of this machine's, at most 6); --jobs is lowered "
                                                       "to the simulations it holds at once, and a run whose "
                                                       "stream does not fit is simulated in chunks."),
    json_out: bool = typer.Option(False, "--json", help="Print the per-category table as JSON."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print the per-category fit tables (train "
                                 "and held-out windows; always in RUN_DIR/fit/)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress and no table."),
) -> None:
    """Fit reuse models per category (exponential by right-censored MLE, and Kaplan-Meier), choose the
    setting to run at each --capacity (a WA variant or a baseline, by simulation on the train window,
    checked on --test), and write the policy file."""
    from tongyi_trace.models import ModelPreset, remember_sizing, run_sizing

    sized: list[ModelPreset] = []
    with progress(quiet or json_out) as bar:
        task = bar.add_task("fit", total=None)

        def on_step(msg: str) -> None:
            name_step(f"fit: {msg}")  # what a memory stop names
            bar.update(task, description=msg, completed=0, total=None)

        def go() -> FitOutcome:
            from tongyi_trace.fit.policy_fit import fit_policy

            run = run_or_trace(run_dir).path
            sizing = run_sizing(run, model)
            sized.append(preset := sizing.preset())
            out = fit_policy(
                run, output if output is not None else run / "fit" / "policy.json", train=train,
                test=test, min_samples=min_samples, life_quantile=life_quantile, life_s=life_s,
                capacities=None if capacity.strip().lower() == "none" else capacity, model=preset,
                jobs=jobs, budget=budget, executor=executor, ray_address=ray_address, context=context,
                holdout=holdout, partitions=partitions,
                confidence=confidence,
                on_step=on_step,
                on_progress=lambda what, done, total: bar.update(task, description=what, completed=done,
                                                                 total=total))
            remember_sizing(run, sizing, "fit")
            return out

        budget = run_cli(lambda: resolve_budget(memory_limit_gib))
        outcome = run_cli(go, budget)
    preset = sized[0]
    if json_out:
        print_json({"policy": abs_path(outcome.policy_path), "artifacts": abs_path(outcome.artifact_dir),
                    "train": outcome.train.to_json(),
                    "test": outcome.test.to_json() if outcome.test else None, "memory": outcome.memory,
                    "rows": outcome.rows,
                    "choices": outcome.policy.choices_json()},
                   "kvtrace.fit-output/1")
    elif not quiet:
        if outcome.policy.choices:
            from tongyi_trace.sim.recommend import choice_answer

            say(("Recommendation", "bold"))
            for choice in outcome.policy.choices:
                say("  " + choice_answer(choice, preset, outcome.policy.block_size))
            say(f"  Sizes for {preset.name}: {preset.hbm_definition()}.")
        if verbose:
            for table in _tables(outcome):
                console.print(table)
        else:
            say(f"{len(outcome.rows)} categories fitted (tables: --verbose, or {outcome.artifact_dir})")
        if outcome.policy.choices:
            console.print(_choice_table(outcome, holdout, verbose))
        for note in (outcome.memory or {}).get("notes", []):
            say(f"memory: {note}")
        say("policy written to ", (str(outcome.policy_path), "bold"),
            f"; table, CDFs and tuning in {outcome.artifact_dir}")


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _choice_table(outcome: FitOutcome, holdout: float, verbose: bool) -> Table:
    """The answer per capacity: the setting the policy file runs there (policy.file.choice_table); its `why`
    column (the Recommendation's sentences say it) only with VERBOSE."""
    from rich.table import Table

    from tongyi_trace.policy.file import choice_table

    where = (f"the last {holdout:.0%} of the train window, parameters fitted on the rest" if holdout > 0
             else "the train window")
    table = Table(title=f"setting to run per capacity (chosen by simulation on {where}; gains in points)")
    columns, rows = choice_table(outcome.policy.choices)
    keep = [i for i, col in enumerate(columns) if verbose or col != "why"]
    for i in keep:
        table.add_column(columns[i], justify="left" if columns[i] in ("capacity", "run", "why") else "right")
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table


def _tables(outcome: FitOutcome) -> list[Table]:
    from rich.table import Table

    w = outcome.train
    train = Table(title=f"reuse fit F(d) = p (1 - exp(-d / mean)), train window {w} s")
    for col in ("category", "samples", "p", "mean reuse s", "life s", "KS", "fallback"):
        train.add_column(col, justify="left" if col == "category" else "right")
    for r in outcome.rows:
        if r["train_num_samples"] is not None:
            train.add_row(r["category"], _fmt(r["train_num_samples"], ","), _fmt(r["reuse_prob"], ".3f"),
                          _fmt(r["mean_reuse_s"], ".1f"), _fmt(r["life_s"], ".1f"),
                          _fmt(r["train_ks"], ".3f"), r["pool"] if r["fallback"] else "")
    if outcome.test is None:
        return [train]
    t = outcome.test
    test = Table(title=f"held-out window {t} s: own fit, and KS of the train fit")
    for col in ("category", "samples", "p", "mean reuse s", "KS own", "KS train fit"):
        test.add_column(col, justify="left" if col == "category" else "right")
    for r in outcome.rows:
        if r["test_num_samples"] is not None:
            test.add_row(r["category"], _fmt(r["test_num_samples"], ","), _fmt(r["test_reuse_prob"], ".3f"),
                         _fmt(r["test_mean_reuse_s"], ".1f"), _fmt(r["test_ks_own"], ".3f"),
                         _fmt(r["test_ks_policy"], ".3f"))
    return [train, test]
