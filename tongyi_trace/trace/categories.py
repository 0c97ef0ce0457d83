"""Request categories w = `<type>-<turn bucket>` (paper section 4.2: e.g. text-1, text-2, text-3+).

Turn buckets are ascending lower bounds: [1, 2, 3] labels turn 1 -> "1", 2 -> "2", >= 3 -> "3+";
[1, 3, 10] labels 1-2 -> "1-2", 3-9 -> "3-9", >= 10 -> "10+". Traces with no type or turn get `all`.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import polars as pl

from tongyi_trace.errors import UsageError

NO_CATEGORY = "all"


def parse_turn_buckets(text: str) -> list[int]:
    """Parse '1,2,3' into ascending bucket lower bounds."""
    try:
        buckets = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--turn-buckets must be comma-separated integers like 1,2,3, got {text!r}") from None
    if not buckets or buckets != sorted(set(buckets)) or buckets[0] < 1:
        raise UsageError(f"--turn-buckets must be strictly ascending integers >= 1, got {text!r}")
    return buckets


def bucket_labels(buckets: list[int]) -> list[str]:
    """The label of each turn bucket."""
    labels = []
    for i, lo in enumerate(buckets):
        if i == len(buckets) - 1:
            labels.append(f"{lo}+")
        else:
            hi = buckets[i + 1] - 1
            labels.append(str(lo) if hi == lo else f"{lo}-{hi}")
    return labels


def categories(types: pl.Series, turns: pl.Series, buckets: list[int]) -> pl.Series:
    """Category name per request from its type and turn (turns below the first bucket join it)."""
    labels = np.array(bucket_labels(buckets), dtype=object)
    turn_arr = turns.fill_null(buckets[0]).to_numpy()
    idx = np.clip(np.searchsorted(np.asarray(buckets), turn_arr, side="right") - 1, 0, len(buckets) - 1)
    names = types.fill_null("unknown").cast(pl.Utf8) + "-" + pl.Series(labels[idx], dtype=pl.Utf8)
    return names.rename("category")


# Context classes a workload-aware policy may append to a category (`kvtrace fit --context`), from what a
# gateway knows when a request arrives: `text-3+|g1|pf`.
PACE_FAST, PACE_SLOW, PACE_UNKNOWN = "pf", "ps", "p?"
SEP = "|"
CONTEXT_COLUMNS = ("req_idx", "chat_id", "parent_chat_id", "user_id", "arrival_s", "category")


class ContextSplits(Protocol):
    """What context_categories reads of a policy file's context (tongyi_trace.policy.file.RequestContext is
    one: the trace layer names its fields, not the policy layer's type, so it imports nothing above it)."""

    @property
    def gap_splits_s(self) -> tuple[float, ...]: ...

    @property
    def pace_split_s(self) -> float | None: ...

    @property
    def pace_min_gaps(self) -> int: ...


def context_categories(requests: pl.DataFrame, context: ContextSplits | None) -> pl.Series:
    """The category a workload-aware policy fitted with CONTEXT keys on, per request (REQUESTS' row order;
    needs CONTEXT_COLUMNS): the run's category, then with CONTEXT.gap_splits_s the conversation's gap class
    and with CONTEXT.pace_split_s the user's pace class:

    gap   `g0`..`gK`: the request's gap to its parent turn (its arrival minus the parent's: the answer's
          generation plus the user's think time) against the ascending splits; first turns get no class.
    pace  the geometric mean of (1 + gap) over the user's follow-up turns that arrived STRICTLY BEFORE
          this request, against 1 + pace_split_s: `pf` (fast) under it, `ps` (slow) above, `p?` with fewer
          than pace_min_gaps such turns or no user id.
    Both use only what is known at the request's arrival."""
    if context is None or (context.pace_split_s is None and not context.gap_splits_s):
        return requests["category"]
    df = _with_gap(requests.select(*CONTEXT_COLUMNS).with_row_index("_row")).sort("arrival_s", "req_idx")
    name = pl.col("category")
    if context.gap_splits_s:
        cls = pl.lit(f"{SEP}g0")
        for i, split in enumerate(sorted(context.gap_splits_s)):  # the largest split met wins (outermost)
            cls = pl.when(pl.col("_gap") >= split).then(pl.lit(f"{SEP}g{i + 1}")).otherwise(cls)
        cls = pl.when(pl.col("_gap").is_null()).then(pl.lit("")).otherwise(cls)
        name = name + cls
    if context.pace_split_s is not None:
        log_gap = pl.col("_gap").log1p()
        has_gap = log_gap.is_not_null().cast(pl.Int64)
        df = df.with_columns(_num=has_gap.cum_sum().over("user_id") - has_gap,
                             _sum=log_gap.fill_null(0.0).cum_sum().over("user_id") - log_gap.fill_null(0.0))
        pace = (pl.when(pl.col("user_id").is_null() | (pl.col("_num") < context.pace_min_gaps))
                .then(pl.lit(PACE_UNKNOWN))
                .when(pl.col("_sum") / pl.col("_num") < math.log1p(context.pace_split_s)).then(pl.lit(PACE_FAST))
                .otherwise(pl.lit(PACE_SLOW)))
        name = name + SEP + pace
    return df.with_columns(category=name).sort("_row")["category"].rename("category")


def follow_up_gaps_s(requests: pl.DataFrame) -> np.ndarray:
    """The gap (seconds) of every follow-up turn of REQUESTS to its parent turn (parents inside REQUESTS)."""
    return _with_gap(requests)["_gap"].drop_nulls().to_numpy()


def _with_gap(requests: pl.DataFrame) -> pl.DataFrame:
    """REQUESTS (in their order) with `_gap`: arrival minus the parent turn's arrival (>= 0), null for a first
    turn or a parent outside REQUESTS."""
    parents = requests.select(pl.col("chat_id").alias("parent_chat_id"), pl.col("arrival_s").alias("_parent_s"))
    return (requests.join(parents.unique("parent_chat_id", keep="first"), on="parent_chat_id", how="left",
                          maintain_order="left")
            .with_columns(_gap=(pl.col("arrival_s") - pl.col("_parent_s")).clip(lower_bound=0.0))
            .drop("_parent_s"))
