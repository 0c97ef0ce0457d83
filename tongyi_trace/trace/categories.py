"""Request categories w = `<type>-<turn bucket>` (paper section 4.2: e.g. text-1, text-2, text-3+).

Turn buckets are ascending lower bounds: [1, 2, 3] labels turn 1 -> "1", 2 -> "2", >= 3 -> "3+";
[1, 3, 10] labels 1-2 -> "1-2", 3-9 -> "3-9", >= 10 -> "10+". Traces with no type or turn get `all`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from tongyi_trace.errors import UsageError

if TYPE_CHECKING:
    from tongyi_trace.fit.params import UserPace

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


# The user's pace class a workload-aware policy may append to a category (`kvtrace fit --pace`):
PACE_FAST, PACE_SLOW, PACE_UNKNOWN = "pf", "ps", "p?"
PACE_SEP = "|"


def user_pace_categories(requests: pl.DataFrame, split_s: float, min_gaps: int) -> pl.Series:
    """Category per request (REQUESTS' row order) with the user's pace class appended: `text-2|pf`.

    A user's pace is the geometric mean of the gaps they took before a follow-up turn (a request's arrival
    minus its parent's: the answer's generation plus the user's think time), over their requests that
    arrived STRICTLY BEFORE this one, so the class uses only what a gateway knows at arrival: `pf` when
    it is under SPLIT_S seconds, `ps` otherwise, `p?` with fewer than MIN_GAPS such gaps or no user id.
    Needs the columns req_idx, chat_id, parent_chat_id, user_id, arrival_s, category."""
    parents = requests.select(pl.col("chat_id").alias("parent_chat_id"), pl.col("arrival_s").alias("_parent_s"))
    df = (requests.select("req_idx", "chat_id", "parent_chat_id", "user_id", "arrival_s", "category")
          .with_row_index("_row")
          .join(parents.unique("parent_chat_id", keep="first"), on="parent_chat_id", how="left")
          .sort("arrival_s", "req_idx"))
    log_gap = (pl.col("arrival_s") - pl.col("_parent_s")).clip(lower_bound=0.0).log1p()
    has_gap = log_gap.is_not_null().cast(pl.Int64)
    df = df.with_columns(
        _num=(has_gap.cum_sum().over("user_id") - has_gap),
        _sum=(log_gap.fill_null(0.0).cum_sum().over("user_id") - log_gap.fill_null(0.0)))
    cls = (pl.when(pl.col("user_id").is_null() | (pl.col("_num") < min_gaps)).then(pl.lit(PACE_UNKNOWN))
           .when(pl.col("_sum") / pl.col("_num") < math.log1p(split_s)).then(pl.lit(PACE_FAST))
           .otherwise(pl.lit(PACE_SLOW)))
    out = df.with_columns(category=pl.col("category") + PACE_SEP + cls).sort("_row")
    return out["category"].rename("category")


def pace_split_s(requests: pl.DataFrame) -> float:
    """The median over follow-up turns of the gap to their parent (seconds): the default fast/slow split of
    user_pace_categories, fitted on the train window's requests."""
    parents = requests.select(pl.col("chat_id").alias("parent_chat_id"), pl.col("arrival_s").alias("_parent_s"))
    gaps = (requests.join(parents.unique("parent_chat_id", keep="first"), on="parent_chat_id", how="inner")
            .select((pl.col("arrival_s") - pl.col("_parent_s")).clip(lower_bound=0.0))).to_series()
    return float(np.median(gaps.to_numpy())) if gaps.len() else 0.0


PACE_COLUMNS = ("req_idx", "chat_id", "parent_chat_id", "user_id", "arrival_s", "category")


def policy_categories(requests: pl.DataFrame, user_pace: UserPace | None) -> pl.Series:
    """The category a workload-aware policy fitted with USER_PACE keys on, per request (REQUESTS' row
    order): the run's category, with the user's pace class appended when USER_PACE is set."""
    if user_pace is None:
        return requests["category"]
    return user_pace_categories(requests, user_pace.split_s, user_pace.min_gaps)
