"""Run the characterization analyses over one run folder and write their artifacts.

Each analysis (one module of this package, one paper figure) takes the shared AnalysisContext and
returns an AnalysisResult; run_analyses writes RUN_DIR/analysis/NAME.json (+ NAME_KEY.parquet per
table) as each one finishes, then analysis/summary.json with every headline figure.
Artifact layout: docs/artifacts/analysis.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from tongyi_trace.analysis.common import (
    ANALYSIS_SCHEMA,
    AnalysisContext,
    AnalysisOptions,
    AnalysisResult,
    model_record,
    open_context,
)
from tongyi_trace.analysis.hit_ratio import hit_ratio
from tongyi_trace.analysis.kv_size import kv_size
from tongyi_trace.analysis.lifespan import lifespan
from tongyi_trace.analysis.live_set import live_set
from tongyi_trace.analysis.next_turn import next_turn
from tongyi_trace.analysis.partitioned import PartitionedContext, partitioned_context
from tongyi_trace.analysis.request_mix import request_mix
from tongyi_trace.analysis.reuse_time import reuse_time
from tongyi_trace.analysis.skew import skew
from tongyi_trace.analysis.spatial import spatial
from tongyi_trace.analysis.turn_hits import turn_hits
from tongyi_trace.analysis.user_heatmap import user_heatmap
from tongyi_trace.artifact_set import commit_sets, staged
from tongyi_trace.budget import MemoryLimitError, step
from tongyi_trace.errors import InputError, UsageError
from tongyi_trace.executor import PartitionOptions
from tongyi_trace.run import RunDir, load_provenance, read_artifact, write_json, write_parquet_atomic

AnalysisFn = Callable[[AnalysisContext], AnalysisResult]

# Report order (paper figure order).
ANALYSES: dict[str, AnalysisFn] = {
    "hit_ratio": hit_ratio,
    "request_mix": request_mix,
    "turn_hits": turn_hits,
    "user_heatmap": user_heatmap,
    "skew": skew,
    "next_turn": next_turn,
    "reuse_time": reuse_time,
    "spatial": spatial,
    "lifespan": lifespan,
    "kv_size": kv_size,
    "live_set": live_set,
}
SUMMARY_FILE = "summary.json"


@dataclass
class AnalysisReport:
    """Everything one `analyze` call produced: the results in report order and where they were written."""

    run: RunDir
    results: dict[str, AnalysisResult]
    out_dir: Path
    elapsed_s: float
    models: list[dict[str, Any]]
    num_partitions: int = 0  # partitions the per-chain work ran in (0: in this process, unpartitioned)

    def summary(self) -> dict[str, Any]:
        """The summary.json document: provenance digest, models and every headline figure."""
        return summary_doc(self.run, self.results, self.elapsed_s, self.out_dir, self.models)


def parse_only(only: str | Sequence[str] | None) -> list[str]:
    """Analysis names to run, in report order; all when ONLY is empty. Unknown names are a UsageError."""
    if only is None:
        return list(ANALYSES)
    names = [n.strip() for n in (only.split(",") if isinstance(only, str) else only) if n.strip()]
    unknown = [n for n in names if n not in ANALYSES]
    if unknown:
        raise UsageError(f"--only: unknown analysis {', '.join(unknown)}; choose from {', '.join(ANALYSES)}")
    return [n for n in ANALYSES if n in names] or list(ANALYSES)


def run_analyses(run: RunDir, only: str | Sequence[str] | None = None, options: AnalysisOptions | None = None,
                 on_done: Callable[[AnalysisResult], None] | None = None,
                 write: bool = True, partitions: PartitionOptions | None = None,
                 on_partition: Callable[[int, int], None] | None = None) -> AnalysisReport:
    """Run the analyses ONLY (default all) over RUN; write artifacts into RUN/analysis/ unless WRITE is False.

    ON_DONE is called after each analysis (progress). With PARTITIONS, the per-chain work runs in that many
    partitions on its executor and is merged (analysis/partitioned.py; the same artifacts), calling
    ON_PARTITION(finished, total) as each partition ends. Returns the results in report order. A writing
    run holds the run folder exclusively (run_lock)."""
    if write:
        with run.lock():
            return _run_analyses(run, only, options, on_done, write, partitions, on_partition)
    return _run_analyses(run, only, options, on_done, write, partitions, on_partition)


def _run_analyses(run: RunDir, only: str | Sequence[str] | None, options: AnalysisOptions | None,
                  on_done: Callable[[AnalysisResult], None] | None, write: bool,
                  partitions: PartitionOptions | None,
                  on_partition: Callable[[int, int], None] | None) -> AnalysisReport:
    out_dir = run.path / "analysis"
    if not write:
        return _analyses_into(run, only, options, on_done, None, out_dir, partitions, on_partition)
    prov = load_provenance(run)
    with staged(run.path, keep_from=out_dir) as stage:  # analyses run earlier with --only are kept
        rep = _analyses_into(run, only, options, on_done, stage, out_dir, partitions, on_partition)
        commit_sets(run.path, [(stage, out_dir)], "analyze", prov.get("run_id"))
    return rep


def _analyses_into(run: RunDir, only: str | Sequence[str] | None, options: AnalysisOptions | None,
                   on_done: Callable[[AnalysisResult], None] | None, stage: Path | None,
                   out_dir: Path, partitions: PartitionOptions | None = None,
                   on_partition: Callable[[int, int], None] | None = None) -> AnalysisReport:
    """Run the analyses; write their artifacts into STAGE (the set committed to OUT_DIR after) unless None."""
    opts = options or AnalysisOptions()
    names = parse_only(only)
    tables = run.tables()
    prov = tables.provenance
    results: dict[str, AnalysisResult] = {}
    models = models_doc(opts, int(prov.get("block_size") or 16))
    t0 = time.perf_counter()
    with open_context(tables, opts, temp_dir=stage) as local:
        ctx = local
        if partitions is not None:
            with step("analysis partitions"):
                ctx = partitioned_context(local, names, partitions, on_partition)
        for name in names:
            t = time.perf_counter()
            try:
                with step(f"analysis {name}"):
                    res = ANALYSES[name](ctx)
            except duckdb.OutOfMemoryException:
                raise MemoryLimitError(f"analysis {name}: DuckDB ran out of memory at its {opts.memory_limit_gib:g} "
                                       "GiB (its share of --memory-limit-gib); raise --memory-limit-gib") from None
            res.elapsed_s = time.perf_counter() - t
            results[name] = res
            if stage is not None:
                write_result(stage, res)
                write_json(stage / SUMMARY_FILE, summary_doc(run, results, time.perf_counter() - t0, stage,
                                                                 models))
            if on_done is not None:
                on_done(res)
    num_partitions = partitions.num_partitions if isinstance(ctx, PartitionedContext) and partitions else 0
    return AnalysisReport(run, results, out_dir, time.perf_counter() - t0, models, num_partitions)


def write_result(out_dir: Path, res: AnalysisResult) -> None:
    """Write RES as out_dir/NAME.json plus one Parquet file per table (stale tables of NAME removed)."""
    for old in out_dir.glob(f"{res.name}_*.parquet"):
        if old.name not in {res.table_file(k) for k in res.tables}:
            old.unlink()
    for key, df in res.tables.items():
        write_parquet_atomic(df, out_dir / res.table_file(key))
    write_json(out_dir / f"{res.name}.json", res.to_json())


def summary_doc(run: RunDir, results: dict[str, AnalysisResult], elapsed_s: float, out_dir: Path,
                models: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary.json document (what `kvtrace analyze --json` prints)."""
    prov = load_provenance(run)
    keys = ("source", "sha256", "format", "block_size", "num_requests", "num_block_refs",
            "num_distinct_blocks", "duration_s", "has_types", "has_turns", "has_users", "has_sessions", "sessions")
    previous = _previous_summary(out_dir)
    analyses = dict(previous.get("analyses", {}))
    for name, r in results.items():
        analyses[name] = {"title": r.title, "figure": r.figure, "status": r.status, "reason": r.reason,
                          "headline": r.headline, "absent_parts": r.absent_parts,
                          "elapsed_s": round(r.elapsed_s, 3), "file": f"{name}.json"}
    order = [n for n in ANALYSES if n in analyses]
    return {
        "schema": ANALYSIS_SCHEMA,
        "run": str(run.path),
        "trace": {k: prov.get(k) for k in keys},
        "models": models,
        "elapsed_s": round(elapsed_s, 3),
        "analyses": {n: analyses[n] for n in order},
    }


def _previous_summary(out_dir: Path) -> dict[str, Any]:
    """The summary already in OUT_DIR (analyses run earlier with --only are kept), or {}."""
    try:
        return read_artifact(out_dir / SUMMARY_FILE, ANALYSIS_SCHEMA, required=False) or {}
    except InputError:
        return {}  # unreadable, of another schema or made from another ingest: nothing of it is kept


def models_doc(opts: AnalysisOptions, block_size: int) -> list[dict[str, Any]]:
    """JSON records of the model presets used."""
    return [model_record(m, block_size) for m in opts.models]
