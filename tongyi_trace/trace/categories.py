"""Request categories w = `<type>-<turn bucket>` (paper section 4.2: e.g. text-1, text-2, text-3+).

Turn buckets are ascending lower bounds: [1, 2, 3] labels turn 1 -> "1", 2 -> "2", >= 3 -> "3+";
[1, 3, 10] labels 1-2 -> "1-2", 3-9 -> "3-9", >= 10 -> "10+". Traces with no type or turn get `all`.
"""

from __future__ import annotations

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
