"""Reuse events of a run and their right-censored reuse times inside a time window.

Each block access (queries/reuse_events.sql: one row per block reference, with the time of the same
block's next access) gives one sample of the reuse time d of the accessing request's category w
(paper section 3, "Reuse time", Fig 12-15). Inside a window [start_s, end_s), an access at time a is a
sample when start_s <= a < end_s; it is OBSERVED with d = next_access_s - a when the next access happens
by end_s, and otherwise RIGHT-CENSORED at c = end_s - a (we only know that d > c, or that the block is
never reused): dropping or truncating those would bias the fit towards short reuse times.

Blocks of one request share the access time, so the samples are aggregated to (category, time,
observed) -> count: the fit and the Kaplan-Meier estimator work on weighted distinct times.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl

from tongyi_trace.errors import UsageError
from tongyi_trace.resources import read_query
from tongyi_trace.run import RunDir


@dataclass(frozen=True)
class Window:
    """A time window [start_s, end_s) in seconds from the trace start ([start_s, end_s] when the window
    reaches the trace's end, so that the last requests' accesses count as samples)."""

    start_s: float
    end_s: float
    include_end: bool = False

    def contains(self, col: pl.Expr) -> pl.Expr:
        """Polars predicate: the time in COL lies inside the window."""
        upper = col <= self.end_s if self.include_end else col < self.end_s
        return (col >= self.start_s) & upper

    def to_json(self) -> dict[str, float]:
        """{"start_s", "end_s"} as in the policy file."""
        return {"start_s": self.start_s, "end_s": self.end_s}


@dataclass(frozen=True)
class Samples:
    """Weighted reuse-time samples of one category: distinct times, observed flag, count of each."""

    time_s: np.ndarray  # float64: reuse time d when observed, censoring time c otherwise
    observed: np.ndarray  # bool
    count: np.ndarray  # int64, >= 1

    @property
    def num_samples(self) -> int:
        """Number of accesses (observed + censored)."""
        return int(self.count.sum())

    @property
    def num_observed(self) -> int:
        """Number of accesses whose next access falls inside the window."""
        return int(self.count[self.observed].sum())

    @staticmethod
    def concat(parts: list[Samples]) -> Samples:
        """Pool several categories' samples."""
        if not parts:
            return Samples(np.empty(0), np.empty(0, dtype=bool), np.empty(0, dtype=np.int64))
        return Samples(np.concatenate([p.time_s for p in parts]),
                       np.concatenate([p.observed for p in parts]),
                       np.concatenate([p.count for p in parts]))


def parse_window(text: str, trace_end_s: float, option: str) -> Window:
    """Parse START:END (seconds; either side may be empty: trace start / trace end)."""
    start_txt, sep, end_txt = text.partition(":")
    if not sep:
        raise UsageError(f"{option} {text!r}: expected START:END in seconds, e.g. {option} 0:3600")
    try:
        start_s = float(start_txt) if start_txt.strip() else 0.0
        end_s = float(end_txt) if end_txt.strip() else trace_end_s
    except ValueError:
        raise UsageError(f"{option} {text!r}: START and END must be numbers of seconds, "
                         f"e.g. {option} 0:3600") from None
    if not (np.isfinite(start_s) and np.isfinite(end_s)) or start_s < 0 or end_s <= start_s:
        raise UsageError(f"{option} {text!r}: need 0 <= START < END (seconds from the trace start)")
    return Window(start_s, end_s, include_end=end_s >= trace_end_s)


def connect(run: RunDir) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the views `requests` and `blocks` over the run's Parquet."""
    con = duckdb.connect()
    con.read_parquet(str(run.requests_path)).create_view("requests")
    con.read_parquet(str(run.blocks_path)).create_view("blocks")
    return con


def reuse_events(run: RunDir) -> pl.DataFrame:
    """queries/reuse_events.sql over RUN: one row per block access with its next access (see the SQL)."""
    con = connect(run)
    try:
        df = con.sql(read_query("reuse_events")).pl()
        assert isinstance(df, pl.DataFrame)
        return df
    finally:
        con.close()


def window_samples(events: pl.DataFrame, window: Window) -> pl.DataFrame:
    """Aggregated samples of the accesses inside WINDOW: category, type, time_s, observed, count."""
    end = window.end_s
    inside = events.lazy().filter(window.contains(pl.col("access_s")))
    observed = pl.col("next_access_s").is_not_null() & (pl.col("next_access_s") <= end)
    return (
        inside.with_columns(
            observed.alias("observed"),
            pl.when(observed).then(pl.col("next_access_s") - pl.col("access_s"))
            .otherwise(end - pl.col("access_s")).alias("time_s"),
        )
        .group_by("category", "type", "time_s", "observed")
        .agg(pl.len().cast(pl.Int64).alias("count"))
        .sort("category", "time_s", "observed")
        .collect()
    )


def split_by_category(samples: pl.DataFrame) -> dict[str, Samples]:
    """The aggregated samples of `window_samples` as one Samples per category."""
    out: dict[str, Samples] = {}
    for (name,), part in samples.partition_by("category", as_dict=True, maintain_order=True).items():
        out[str(name)] = Samples(part["time_s"].to_numpy().astype(np.float64),
                                 part["observed"].to_numpy().astype(bool),
                                 part["count"].to_numpy().astype(np.int64))
    return out


def category_types(samples: pl.DataFrame) -> dict[str, str | None]:
    """category -> request type (None for traces without types)."""
    pairs = samples.select("category", "type").unique()
    return {str(c): (None if t is None else str(t)) for c, t in pairs.iter_rows()}


def block_lifespans(events: pl.DataFrame, window: Window) -> pl.DataFrame:
    """Per block reused inside WINDOW: category/type of its first access there and its lifespan_s
    (last access - first access inside the window; paper Fig 19-20: a block lives from its first access
    to its last reuse). Blocks accessed once in the window have no lifespan and are left out."""
    return (
        events.lazy()
        .filter(window.contains(pl.col("access_s")))
        .group_by("chain_idx")
        .agg(
            pl.col("category").first(),
            pl.col("type").first(),
            (pl.col("access_s").max() - pl.col("access_s").min()).alias("lifespan_s"),
            pl.len().alias("num_accesses"),
        )
        .filter(pl.col("num_accesses") > 1)
        .select("category", "type", "lifespan_s")
        .collect()
    )
