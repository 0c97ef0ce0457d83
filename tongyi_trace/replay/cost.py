"""TTFT vs uncached prompt tokens: the linear cost model replay exports and `kvtrace simulate --cost-from` reads.

Definition. Over the completed requests of a replay: ttft_s = a_s + b_s_per_token x uncached_tokens,
uncached_tokens = prompt_tokens - cached_tokens (the prefill work the engine really did), fitted by
non-negative least squares (a_s >= 0, b_s_per_token >= 0: a cost cannot be negative; when ordinary least
squares would give a negative value, the best fit with that value at 0 is taken and `constrained` says
so).
Also reported: R^2, the number of points and the uncached-token range the fit covers.

Edge rule (the only one): a fit needs at least MIN_POINTS usable requests (status ok, ttft_ms and
cached_tokens reported) and at least two distinct uncached-token values; otherwise there is no cost
model (None). Requests without cached_tokens are not usable (their uncached tokens are unknown), nor are
replies whose cached_tokens exceed the prompt (their uncached tokens would be negative); both numbers are
recorded in the artifact. At low concurrency TTFT is prefill time; under load it includes
queueing, so fit on a replay whose in-flight count stays low.

The artifact (schema tongyi_trace.schemas.COST_SCHEMA) is written by replay into the replay folder and,
naming that replay, into RUN_DIR/replay/cost_model.json, stamped with the run identity; the simulator
reads only that artifact (tongyi_trace.sim.cost_model.calibrate_from_replay).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from tongyi_trace.schemas import COST_SCHEMA

MIN_POINTS = 3
DEFINITION = "ttft_s = a_s + b_s_per_token * (prompt_tokens - cached_tokens), a_s >= 0, b_s_per_token >= 0"


def fit_ttft_cost(ok_records: pl.DataFrame) -> dict[str, Any] | None:
    """The cost-model artifact fitted to completed records, or None under the edge rule (module doc)."""
    from scipy.optimize import nnls

    timed = ok_records.filter(pl.col("ttft_ms").is_not_null())
    known = timed.filter(pl.col("cached_tokens").is_not_null())
    df = known.filter(pl.col("cached_tokens") <= pl.col("prompt_tokens"))  # else negative uncached tokens
    if df.height < MIN_POINTS:
        return None
    x = (df["prompt_tokens"] - df["cached_tokens"]).to_numpy().astype(np.float64)
    y = df["ttft_ms"].to_numpy().astype(np.float64) / 1e3
    if np.ptp(x) == 0:
        return None
    (a, b), _ = nnls(np.stack([np.ones_like(x), x], axis=1), y)
    resid = y - (a + b * x)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return {"schema": COST_SCHEMA, "a_s": float(a), "b_s_per_token": float(b), "r2": r2,
            "constrained": bool(a == 0.0 or b == 0.0), "num_points": int(df.height),
            "num_without_cached_tokens": int(timed.height - known.height),
            "num_cached_over_prompt": int(known.height - df.height),
            "uncached_tokens_min": int(x.min()), "uncached_tokens_max": int(x.max()), "definition": DEFINITION}
