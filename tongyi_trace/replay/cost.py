"""TTFT vs uncached prompt tokens: the linear cost model `kvtrace simulate --cost-from RUN_DIR` reads.

Definition. Over the requests of a replay that completed: ttft_s = a_s + b_s_per_token x uncached_tokens,
uncached_tokens = prompt_tokens - cached_tokens (the prefill work the engine really did), fitted by
ordinary least squares (numpy.polyfit, degree 1). Also reported: R^2, the number of points and the
uncached-token range the fit covers. At low concurrency TTFT is prefill time; under load it includes
queueing, so fit on a replay whose in-flight count stays low.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

COST_SCHEMA = "kvtrace.cost/1"


def fit_ttft_cost(ok_records: pl.DataFrame) -> dict[str, Any] | None:
    """The a, b fit of TTFT over uncached tokens, or None with fewer than 3 usable points."""
    df = ok_records.filter(pl.col("ttft_ms").is_not_null() & pl.col("cached_tokens").is_not_null())
    if df.height < 3:
        return None
    x = (df["prompt_tokens"] - df["cached_tokens"]).to_numpy().astype(np.float64)
    y = df["ttft_ms"].to_numpy().astype(np.float64) / 1e3
    if np.ptp(x) == 0:
        return None
    b, a = np.polyfit(x, y, 1)
    resid = y - (a + b * x)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return {"schema": COST_SCHEMA, "a_s": float(a), "b_s_per_token": float(b), "r2": r2,
            "num_points": int(df.height), "uncached_tokens_min": int(x.min()),
            "uncached_tokens_max": int(x.max()),
            "definition": "ttft_s = a_s + b_s_per_token * (prompt_tokens - cached_tokens)"}
