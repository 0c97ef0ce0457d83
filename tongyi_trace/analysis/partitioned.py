"""The per-chain work of the analyses in partitions (`kvtrace analyze --executor ray --partitions N`).

A chain (prefix-chained block) belongs to partition splitmix64(chain_id) mod N, so every reference of a
block, hence its first use, reuse gaps, lifespan and live interval, is in one partition. Each partition
is one task (executor.map_tasks: Ray workers, or the local pool): it streams the run's blocks.parquet,
keeps only its rows (the hash predicate, batch by batch: a worker never holds the whole table), builds
the `chains` table and the `reuse_events` view over them with the same SQL as the local run
(chains_table.sql, reuse_events.sql) and runs the per-chain queries of the analyses asked for. The
content-hit part of req_hit_parts.sql needs whole block ids instead: the same task also keeps the rows
whose splitmix64(block_id) mod N is its partition.

The driver merges exactly, then runs every analysis as the local run does, its per-chain queries served
from the merge:
- histograms and counts add (reuse_time.sql, lifespan.sql, skew_blocks.sql, user_heatmap.sql: a group-by
  sum over the partitions' rows; every summed column is an integer, the reuse times in whole microseconds);
- per-request sums (req_hit_parts.sql, live_deltas.sql) are concatenated and summed by the local run's
  own SQL (req_hits_table.sql, live_set.sql): the per-request figures are computed after the merge;
- lifespan percentiles are interpolated from the merged histogram of exact lifespans (lifespan_values.sql)
  as the local run interpolates them from its own (analysis/lifespan.py: DuckDB's quantile_cont to the bit),
  their mean from the exact sum in microseconds.
So every artifact equals the local run's to the bit (tests/study/test_analyze_partitioned.py).
The analyses that are not per chain (request_mix, next_turn, kv_size, spatial) run in the driver as today.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from tongyi_trace.analysis.common import BIN_MAX, BIN_MIN, BIN_ZERO, BINS_PER_DECADE, AnalysisContext, AnalysisOptions
from tongyi_trace.analysis.reuse_time import LONG_S, SHORT_S
from tongyi_trace.budget import spill_dir
from tongyi_trace.duckdb_setup import duckdb_connect
from tongyi_trace.errors import KvtraceError
from tongyi_trace.executor import PartitionOptions, check_partitions
from tongyi_trace.resources import read_query
from tongyi_trace.run import RunTables
from tongyi_trace.trace.partition import map_partitions, read_partition


@dataclass(frozen=True)
class _Merge:
    """How the rows of one per-chain query from the partitions become the whole run's."""

    keys: tuple[str, ...]  # group-by keys of a summing merge; () = concatenate (the SQL after sums)
    order: tuple[tuple[str, bool], ...] = ()  # (column, descending): the query's ORDER BY
    needs: str = "chains"  # the table or view the query reads


_HIST_PARAMS = {"bin_zero": BIN_ZERO, "bin_min": BIN_MIN, "bin_max": BIN_MAX, "bins_per_decade": BINS_PER_DECADE}
# The per-chain queries and the parameters the analyses run them with (a served query checks them).
_MERGES: dict[str, _Merge] = {
    "reuse_time": _Merge(("category", "bin"), (("category", False), ("bin", False)), "reuse_events"),
    "lifespan": _Merge(("category", "reused", "bin"), (("category", False), ("reused", False), ("bin", False))),
    "lifespan_values": _Merge(("category", "reused", "lifespan_s", "lifespan_us")),
    "skew_blocks": _Merge(("num_reuses",), (("num_reuses", True),)),
    "user_heatmap": _Merge(("producer", "consumer")),
    "req_hit_parts": _Merge(()),
    "live_deltas": _Merge(()),
}
# What each per-chain analysis needs of the partitions.
_NEEDS: dict[str, tuple[str, ...]] = {
    "hit_ratio": ("req_hit_parts",),
    "turn_hits": ("req_hit_parts",),
    "skew": ("skew_blocks", "req_hit_parts"),
    "user_heatmap": ("user_heatmap",),
    "reuse_time": ("reuse_time",),
    "lifespan": ("lifespan", "lifespan_values"),
    "live_set": ("live_deltas",),
}
PARTITIONED_ANALYSES = tuple(_NEEDS)


def query_params(name: str, ctx: AnalysisContext) -> dict[str, Any]:
    """The $-parameters the analyses run the per-chain query NAME with."""
    if name == "reuse_time":
        return {**_HIST_PARAMS, "short_s": SHORT_S, "long_s": LONG_S}
    if name == "lifespan":
        return dict(_HIST_PARAMS)
    if name == "user_heatmap":
        return {"use_users": ctx.key_kind() == "user"}
    return {}


def partition_queries(ctx: AnalysisContext, names: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """The per-chain queries the analyses NAMES need, each with its parameters (sorted by name)."""
    wanted = sorted({q for n in names for q in _NEEDS.get(n, ())})
    if "user_heatmap" in wanted and ctx.key_kind() is None:
        wanted.remove("user_heatmap")  # the analysis is absent without keys: it asks nothing
    return [(n, query_params(n, ctx)) for n in wanted]


class _PartitionContext(AnalysisContext):
    """An AnalysisContext whose `blocks` is one partition: `chains` comes from chains_table.sql over it."""

    def ensure(self, table: str) -> None:
        """See AnalysisContext.ensure; chains over this partition's blocks."""
        if table == "chains" and table not in self._tables:
            self.con.execute(read_query("chains_table"))
            self._tables.add(table)
            return
        super().ensure(table)


def partition_task(part: int, shared: Mapping[str, Any]) -> dict[str, pl.DataFrame]:
    """One partition's rows of every per-chain query in shared['queries'] ((name, params) pairs)."""
    tables: RunTables = shared["tables"]
    options: AnalysisOptions = shared["options"]
    blocks, content = read_partition(tables, part, int(shared["num_partitions"]))
    assert content is not None
    with spill_dir(Path(tempfile.mkdtemp(prefix="kvtrace-duckdb-"))) as spill:
        con = duckdb_connect(spill, f"{int(options.memory_limit_gib * 1024)}MB", 1)
        try:
            con.read_parquet(str(tables.requests_path)).create_view("requests")
            con.register("blocks", blocks)
            con.register("content_blocks", content)
            ctx = _PartitionContext(tables, options, con)
            out = {}
            for name, params in shared["queries"]:
                ctx.ensure(_MERGES[name].needs)
                out[name] = ctx.query(name, **params)
            return out
        finally:
            con.close()


def merge_rows(name: str, frames: Sequence[pl.DataFrame]) -> pl.DataFrame:
    """The whole run's rows of per-chain query NAME from its partitions' FRAMES (in partition order)."""
    m = _MERGES[name]
    df = pl.concat(frames, how="vertical")
    if m.keys:
        keys = list(m.keys)
        df = df.group_by(keys, maintain_order=True).agg(pl.exclude(keys).sum()).select(frames[0].columns)
    if m.order:
        df = df.sort([c for c, _ in m.order], descending=[d for _, d in m.order], nulls_last=True,
                     maintain_order=True)
    return df


class PartitionedContext(AnalysisContext):
    """The driver's AnalysisContext: the per-chain queries are served from the partitions' merged rows;
    everything else runs in its DuckDB session as locally."""

    def __init__(self, base: AnalysisContext, merged: dict[str, pl.DataFrame],
                 params: dict[str, dict[str, Any]]) -> None:
        super().__init__(base.tables, base.options, base.con)
        self._merged = merged
        self._params = params

    def query(self, name: str, **params: Any) -> pl.DataFrame:
        """See AnalysisContext.query; a per-chain query's merged rows (same parameters checked)."""
        if name not in self._merged or name in _CONCATENATED:
            return super().query(name, **params)
        if params != self._params.get(name, {}):
            raise KvtraceError(f"analysis query {name}: run with {params}, partitions computed "
                               f"{self._params.get(name)}; keep analysis/partitioned.py's query_params in step")
        return self._merged[name]

    def ensure(self, table: str) -> None:
        """See AnalysisContext.ensure; chains and reuse_events exist only in the partitions (the queries over
        them are served merged), the per-request parts (req_hit_parts, live_deltas) are the partitions' rows."""
        if table in self._tables or table in ("chains", "reuse_events"):
            return
        if table in _CONCATENATED:
            self.con.register(table, self._merged[table].to_arrow())
            self._tables.add(table)
            return
        super().ensure(table)


_CONCATENATED = frozenset(n for n, m in _MERGES.items() if not m.keys)


def partitioned_context(ctx: AnalysisContext, names: Sequence[str], opts: PartitionOptions,
                        on_partition: Callable[[int, int], None] | None = None) -> AnalysisContext:
    """CTX with the per-chain queries of the analyses NAMES computed in OPTS.num_partitions partitions on
    OPTS.executor and merged; CTX itself when none of NAMES is per chain. ON_PARTITION(finished, total) as
    each partition ends (progress)."""
    check_partitions(opts.num_partitions)  # a bad N is refused even when no analysis asked is per chain
    queries = partition_queries(ctx, names)
    if not queries:
        return ctx
    params = dict(queries)
    wanted = list(params)
    results = map_partitions(partition_task, ctx.tables, opts, {"options": ctx.options, "queries": queries},
                             "analyze", on_partition)
    merged = {n: merge_rows(n, [part[n] for part in results]) for n in wanted}
    return PartitionedContext(ctx, merged, params)
