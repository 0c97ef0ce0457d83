"""Shared machinery of the characterization analyses: the DuckDB session over one run folder, the
result record every analysis returns, and small exact helpers (Lorenz curves, log-spaced bins).

The DuckDB session registers the views `requests` and `blocks` over the run's Parquet files, plus
`refs` (blocks joined with their request's attributes) and, on demand, two shared tables every
analysis can build on (each one SQL file in queries/):
- `chains`   (chains_table.sql; computed by analysis/chains.py): one row per distinct prefix-chained block.
- `req_hits` (req_hits_table.sql): one row per request: its ideal prefix and content hits, summed from
  the view `req_hit_parts` (req_hit_parts.sql).
- `live_deltas` (live_deltas.sql): per request, the change of the oracle's live set.
The per-chain work (chains, reuse_events and what is built on them) can instead run in partitions of the
chains on Ray workers: analysis/partitioned.py.
Memory limit, temporary (spill) directory and thread count are set so that a 10x trace spills to
disk instead of running out of memory.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from tongyi_trace.analysis.chains import chains_table, write_chains_table
from tongyi_trace.budget import spill_dir
from tongyi_trace.duckdb_setup import duckdb_connect
from tongyi_trace.errors import InputError, UsageError
from tongyi_trace.models import DEFAULT_MODEL, MAX_GPU_MEM_GIB, MAX_MODEL_NUMBER, PRESETS, ModelPreset, get_preset
from tongyi_trace.resources import read_query
from tongyi_trace.run import RunTables
from tongyi_trace.schemas import ANALYSIS_SCHEMA

# Log-spaced time bins shared by the reuse-time and lifespan distributions: bin k holds values in
# (10^((k-1)/10), 10^(k/10)] seconds, k in [BIN_MIN, BIN_MAX]; values <= 0 go to bin BIN_ZERO.
BIN_MIN = -30  # 1 ms
BIN_MAX = 60  # 10^6 s
BIN_ZERO = BIN_MIN - 1
BINS_PER_DECADE = 10


def bin_upper_s(k: int) -> float:
    """Upper edge in seconds of log bin K (0.0 for the bin of zero values)."""
    return 0.0 if k == BIN_ZERO else 10.0 ** (k / BINS_PER_DECADE)


@dataclass
class AnalysisResult:
    """What one analysis found: headline figures (JSON scalars) and tables (written as Parquet).

    status is "ok" or "absent" (the trace lacks what the analysis needs; `reason` says what).
    `absent_parts` names sub-sections that could not be computed, each with its reason.
    """

    name: str
    title: str
    figure: str
    definition: str
    status: str = "ok"
    reason: str | None = None
    headline: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    absent_parts: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the analysis ran (status "ok")."""
        return self.status == "ok"

    def table_file(self, key: str) -> str:
        """File name of table KEY inside RUN_DIR/analysis/."""
        return f"{self.name}_{key}.parquet"

    def to_json(self) -> dict[str, Any]:
        """The NAME.json document (tables are referenced by file name)."""
        return {
            "schema": ANALYSIS_SCHEMA,
            "name": self.name,
            "title": self.title,
            "figure": self.figure,
            "definition": self.definition,
            "status": self.status,
            "reason": self.reason,
            "headline": self.headline,
            "tables": {k: self.table_file(k) for k in self.tables},
            "absent_parts": self.absent_parts,
            "elapsed_s": round(self.elapsed_s, 3),
        }


@dataclass(frozen=True)
class AnalysisOptions:
    """Knobs of the analyses (all have defaults)."""

    models: tuple[ModelPreset, ...] = tuple(PRESETS.values())
    top_n: int = 20  # users/sessions shown in the producer x consumer heatmap
    window_s: float = 600.0  # next-turn probability windows
    memory_limit_gib: float = 2.0  # DuckDB memory limit (it spills to disk beyond)
    threads: int = 2  # DuckDB threads


class AnalysisContext:
    """One DuckDB session over a run's tables, shared by the analyses of one `analyze` call."""

    def __init__(self, tables: RunTables, options: AnalysisOptions, con: duckdb.DuckDBPyConnection,
                 spill: Path | None = None) -> None:
        self.tables = tables
        self.spill = spill  # where shared tables are written out of core (the session's spill folder)
        self.provenance = tables.provenance
        self.options = options
        self.con = con
        self._tables: set[str] = set()

    @property
    def block_size(self) -> int:
        """Tokens per block (from provenance)."""
        return int(self.provenance.get("block_size") or 16)

    def flag(self, name: str) -> bool:
        """A provenance flag such as has_types / has_turns / has_users / has_sessions."""
        return bool(self.provenance.get(name, False))

    def key_kind(self) -> str | None:
        """'user' when the trace has user ids, 'session' when it only has conversations, else None."""
        if self.flag("has_users"):
            return "user"
        if self.flag("has_sessions"):
            return "session"
        return None

    def query(self, name: str, **params: Any) -> pl.DataFrame:
        """Run queries/NAME.sql with $-parameters PARAMS and return the result as a Polars frame."""
        try:
            rel = self.con.sql(read_query(name), params=params or None)
            df = pl.DataFrame() if rel is None else pl.from_arrow(rel.to_arrow_table())
        except duckdb.OutOfMemoryException as e:
            raise UsageError(f"query {name}: DuckDB ran out of memory ({e}); raise --memory-limit-gib "
                             "or free disk space for spilling") from e
        assert isinstance(df, pl.DataFrame)
        # DuckDB sums of BIGINT are HUGEINT (Arrow decimal(38,0)): counts back to Int64.
        return df.with_columns(pl.col(pl.Decimal).cast(pl.Int64))

    def ensure(self, table: str) -> None:
        """Build the shared temp table TABLE (chains, req_hits) or view (reuse_events, req_hit_parts,
        live_deltas) once."""
        if table in self._tables:
            return
        for dep in _TABLE_DEPS.get(table, ()):
            self.ensure(dep)
        if table in _SHARED_VIEWS:
            self.con.sql(read_query(table)).create_view(table)
        elif table == "chains":  # numpy, held equal to chains_table.sql by tests/analysis/test_chains.py
            num_chains = int(self.provenance["num_distinct_blocks"])
            if self.spill is None:
                self.con.register(table, chains_table(self.tables, num_chains))
            else:  # out of core: written in slices, read back by DuckDB within its memory limit
                path = write_chains_table(self.tables, num_chains, self.spill / "chains.parquet")
                self.con.read_parquet(str(path)).create_view(table)
        else:
            self.con.execute(read_query(f"{table}_table"))
        self._tables.add(table)


_TABLE_DEPS: dict[str, tuple[str, ...]] = {"req_hits": ("req_hit_parts",), "req_hit_parts": ("chains",),
                                           "live_deltas": ("chains",)}
# Queries registered as views under their own name (reuse_events is shared with `kvtrace fit`).
_SHARED_VIEWS = frozenset({"reuse_events", "req_hit_parts", "live_deltas"})


@contextmanager
def open_context(tables: RunTables, options: AnalysisOptions,
                 temp_dir: Path | None = None) -> Iterator[AnalysisContext]:
    """A DuckDB session over the run's TABLES with views requests/blocks/refs; spills into TEMP_DIR (removed
    after)."""
    for p in (tables.requests_path, tables.blocks_path):
        if not p.is_file():
            raise InputError(f"{p}: missing; re-run 'kvtrace ingest' to rebuild the run folder")
    if not 0.25 <= options.memory_limit_gib < 1 << 20 or not 1 <= options.threads <= 1024:  # refuses NaN
        raise UsageError(f"--memory-limit-gib {options.memory_limit_gib} must be in [0.25, 2^20) and --threads "
                         f"{options.threads} in 1..1024")
    if options.top_n < 1 or not 0 < options.window_s < math.inf:
        raise UsageError(f"--top-n {options.top_n} must be >= 1 and --window-s {options.window_s} a finite "
                         "number > 0")
    with spill_dir(Path(tempfile.mkdtemp(prefix="duckdb-", dir=temp_dir))) as spill:  # removed after, and by a stop
        con = duckdb_connect(spill, f"{int(options.memory_limit_gib * 1024)}MB", options.threads)
        try:
            con.read_parquet(str(tables.requests_path)).create_view("requests")
            con.read_parquet(str(tables.blocks_path)).create_view("blocks")
            con.read_parquet(str(tables.blocks_path)).create_view("content_blocks")  # req_hit_parts.sql
            con.execute(read_query("refs_view"))
            yield AnalysisContext(tables, options, con, spill)
        finally:
            con.close()


def absent(result: AnalysisResult, reason: str) -> AnalysisResult:
    """Mark RESULT as absent for REASON (one sentence saying what the trace lacks)."""
    result.status = "absent"
    result.reason = reason
    return result


def lorenz(hist: pl.DataFrame, value: str, count: str, num_points: int = 100) -> pl.DataFrame:
    """Concentration curve from a histogram (VALUE per item, COUNT items having it).

    Items are sorted by VALUE descending; returns share_items (0, 1/num_points, ..., 1) and
    share_value = share of the total VALUE held by the top share_items of items. Exact: items inside
    one histogram row all hold the same value, so the curve is linear inside a row.
    """
    h = hist.filter(pl.col(count) > 0).sort(value, descending=True)
    vals = h[value].cast(pl.Float64).to_list()
    cnts = h[count].cast(pl.Float64).to_list()
    total_items = sum(cnts)
    total_value = sum(v * c for v, c in zip(vals, cnts, strict=True))
    xs = [i / num_points for i in range(num_points + 1)]
    ys = [top_share(vals, cnts, x * total_items, total_value) for x in xs]
    return pl.DataFrame({"share_items": xs, "share_value": ys})


def top_share(vals: Sequence[float], cnts: Sequence[float], num_items: float, total_value: float) -> float:
    """Share of TOTAL_VALUE held by the top NUM_ITEMS items of a descending (VALS, CNTS) histogram."""
    if total_value <= 0:
        return 0.0
    got = 0.0
    left = num_items
    for v, c in zip(vals, cnts, strict=True):
        take = min(c, left)
        got += take * v
        left -= take
        if left <= 0:
            break
    return min(1.0, got / total_value)


def items_for_share(vals: Sequence[float], cnts: Sequence[float], share: float) -> float:
    """Smallest number of top items (descending histogram) whose value reaches SHARE of the total."""
    total = sum(v * c for v, c in zip(vals, cnts, strict=True))
    if total <= 0:
        return 0.0
    need = share * total
    got = 0.0
    n = 0.0
    for v, c in zip(vals, cnts, strict=True):
        if v <= 0:
            break
        if got + v * c >= need - 1e-9 * total:
            return n + math.ceil((need - got) / v - 1e-9)
        got += v * c
        n += c
    return n


def ratio(num: float, den: float) -> float | None:
    """NUM / DEN, or None when DEN is 0 (JSON null: undefined, not zero)."""
    return float(num) / float(den) if den else None


_SHAPE_OPTIONS = {"num_layers": "--layers", "num_kv_heads": "--kv-heads", "head_dim": "--head-dim",
                  "dtype_bytes": "--dtype-bytes", "num_params": "--params-b"}


def resolve_models(names: Sequence[str], *, num_layers: int | None = None, num_kv_heads: int | None = None,
                   head_dim: int | None = None, dtype_bytes: int | None = None,
                   params_b: float | None = None, gpu_mem_gib: float | None = None, tp: int | None = None,
                   reserve_gib: float | None = None,
                   utilization: float | None = None) -> tuple[ModelPreset, ...]:
    """Model presets NAMES with the given overrides; the name 'custom' builds one from the shape options.

    Shape overrides (layers, KV heads, head dim, dtype bytes, parameters in billions) apply to every
    named model; 'custom' requires all of them.
    """
    shape: dict[str, Any] = {k: v for k, v in {
        "num_layers": num_layers, "num_kv_heads": num_kv_heads, "head_dim": head_dim,
        "dtype_bytes": dtype_bytes, "num_params": None if params_b is None else params_b * 1e9,
    }.items() if v is not None}
    for k, v in shape.items():
        if not (0 < v <= MAX_MODEL_NUMBER):
            raise UsageError(f"model option {k} must be a number > 0 and <= {MAX_MODEL_NUMBER:g}, got {v}")
    for flag, v, ok in (("--gpu-util", utilization, "in (0, 1]"), ("--gpu-mem-gib", gpu_mem_gib, "> 0"),
                        ("--reserve-gib", reserve_gib, ">= 0"), ("--tp", tp, "> 0")):
        good = v is None or (v <= MAX_GPU_MEM_GIB and (0 < v <= 1 if flag == "--gpu-util" else
                                                       v >= 0 if flag == "--reserve-gib" else v > 0))
        if not good:
            raise UsageError(f"{flag} {v}: give a number {ok} and <= {MAX_GPU_MEM_GIB}")
    out: list[ModelPreset] = []
    for name in names:
        is_custom = name.lower() == "custom"
        if is_custom:
            missing = [opt for key, opt in _SHAPE_OPTIONS.items() if key not in shape]
            if missing:
                raise UsageError(f"--model custom needs {', '.join(missing)}")
        # 'custom' starts from any preset's GPU-side defaults (tp 1, 80 GiB) and replaces the whole shape.
        preset = get_preset(DEFAULT_MODEL if is_custom else name, gpu_mem_gib=gpu_mem_gib, tp=tp,
                            reserve_gib=reserve_gib, utilization=utilization)
        if shape:
            preset = replace(preset, name="custom" if is_custom else f"{preset.name}*", **shape)
        preset.hbm_kv_bytes  # noqa: B018 - raises UsageError when nothing is left for KV
        out.append(preset)
    if not out:
        raise UsageError("--model: give at least one model preset")
    return tuple(out)


def model_record(m: ModelPreset, block_size: int) -> dict[str, Any]:
    """JSON description of model M as the analyses used it."""
    return {
        "name": m.name, "num_layers": m.num_layers, "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim,
        "dtype_bytes": m.dtype_bytes, "num_params": m.num_params, "tp": m.tp,
        "gpu_mem_bytes": m.gpu_mem_bytes, "gpu_mem_utilization": m.gpu_mem_utilization,
        "activation_reserve_bytes": m.activation_reserve_bytes,
        "kv_bytes_per_token": m.kv_bytes_per_token, "kv_bytes_per_block": m.kv_bytes_per_block(block_size),
        "hbm_kv_bytes": m.hbm_kv_bytes, "hbm_blocks": m.hbm_blocks(block_size),
    }


def hist_quantile(values: Sequence[float], counts: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile Q of a histogram sorted by VALUES ascending: the smallest value whose
    cumulative count reaches ceil(Q x total) (at least 1); None for an empty histogram."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total - 1e-9))
    cum = 0.0
    for v, c in zip(values, counts, strict=True):
        cum += c
        if cum >= rank:
            return float(v)
    return float(values[-1])


def key_label(kind: str | None) -> str:
    """Human name of the heatmap/skew key: users, or sessions (conversation roots) as a fallback."""
    return "users" if kind == "user" else "sessions (conversation roots; the trace has no user ids)"


NO_KEYS_REASON = ("the trace has neither user ids nor multi-request conversations (every request is its "
                  "own session, e.g. a Mooncake trace ingested with --no-infer-sessions), so there is no "
                  "producer/consumer identity")
