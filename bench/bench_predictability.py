"""How predictable is "will this conversation continue" from what a gateway knows? (`make bench`)

The policy issue's 0.5L and 1L gap to the oracle is almost all "whether" (bench_policy.py: oracle-dead).
A policy can only close it as far as a next turn is predictable while the request is served. This measures
that ceiling on the default to-C traces without running any policy: per request, the target is "a later request
names it as parent"; the predictors are cell rates (each cell's share of requests with a next turn,
shrunk to the overall share with weight 5) fitted on seed 1 and scored on seeds 2 and 3 by AUC (0.5 = chance),
for nested sets of features every gateway or engine has:

- the run's category (type and turn bucket): WA's categories;
- the same with WA's context classes (the gap to the previous turn, the user's pace so far), as `kvtrace
  fit --context auto` fits them on seed 1 (tongyi_trace.trace.categories): what the fitted policy keys on;
- the new input (input minus the previous turn's input and output), the input and the output length;
- the user's history so far: requests sent, and the share of them already answered by a next turn
  (online: only next turns that arrived before this request);
- and, not available online, the user's continuation share over the whole trace (hindsight, leave-one-out).

Printed: AUC over all requests and over later turns (turn >= 2), and each cell table's size; last, all
online features in one additive logistic model (no cells, so no cell too thin to learn from).

    .venv/bin/python bench/bench_predictability.py
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import polars as pl
from _common import ingested_run
from scipy.optimize import minimize
from scipy.stats import rankdata

from tongyi_trace.fit.events import Window
from tongyi_trace.fit.policy_fit import fit_context
from tongyi_trace.policy.file import RequestContext
from tongyi_trace.trace.categories import context_categories

SHRINK = 5.0  # prior weight of the overall share in a cell's rate
Codes = dict[str, npt.NDArray[np.int64]]  # feature name -> each request's bin


def request_features(run_requests: pl.DataFrame, context: RequestContext | None) -> pl.DataFrame:
    """Requests with the target `has_next` and every feature above (CONTEXT: the classes of `context`), in
    arrival order."""
    r = run_requests.with_columns(context=context_categories(run_requests, context)).sort("arrival_s", "req_idx")
    nxt = (r.filter(pl.col("parent_chat_id") >= 0).group_by("parent_chat_id")
           .agg(pl.col("arrival_s").min().alias("next_s")))
    parent = r.select(pl.col("chat_id").alias("parent_chat_id"), pl.col("input_tokens").alias("parent_in"),
                      pl.col("output_tokens").alias("parent_out"))
    r = (r.join(nxt, left_on="chat_id", right_on="parent_chat_id", how="left")
         .join(parent, on="parent_chat_id", how="left")
         .with_columns(has_next=pl.col("next_s").is_not_null(),
                       new_in_tokens=pl.col("input_tokens") - pl.col("parent_in") - pl.col("parent_out"))
         .sort("arrival_s", "req_idx"))
    # The user's history at each arrival: earlier requests, and those whose next turn has arrived by now
    # (kind -1 sorts a next turn that arrives with this request before it: known by then).
    sent = r.select("user_id", pl.col("arrival_s").alias("t"), pl.lit(0, pl.Int32).alias("kind"), "req_idx",
                    pl.lit(1).alias("sent"), pl.lit(0).alias("answered"))
    answered = r.filter(pl.col("has_next")).select(
        "user_id", pl.col("next_s").alias("t"), pl.lit(-1, pl.Int32).alias("kind"),
        pl.lit(-1, pl.Int64).alias("req_idx"), pl.lit(0).alias("sent"), pl.lit(1).alias("answered"))
    events = pl.concat([sent, answered]).sort("user_id", "t", "kind").with_columns(
        user_sent=pl.col("sent").cum_sum().over("user_id") - pl.col("sent"),
        user_answered=pl.col("answered").cum_sum().over("user_id"))
    r = r.join(events.filter(pl.col("kind") == 0).select("req_idx", "user_sent", "user_answered"), on="req_idx")
    total = r.group_by("user_id").agg(pl.len().alias("n_u"), pl.col("has_next").sum().alias("k_u"))
    return r.join(total, on="user_id").with_columns(
        user_share_online=pl.col("user_answered") / pl.col("user_sent").clip(1),
        user_share_hindsight=(pl.col("k_u") - pl.col("has_next").cast(pl.Int64)) / (pl.col("n_u") - 1).clip(1))


def _bins(x: npt.NDArray[np.float64], edges: list[float]) -> npt.NDArray[np.int64]:
    return np.asarray(np.digitize(np.nan_to_num(x, nan=-np.inf), edges), dtype=np.int64)


FEATURE_SETS: dict[str, list[str]] = {
    "WA's categories (type, turn bucket)": ["category"],
    "+ context classes (gap, user's pace)": ["context"],
    "+ new input, input, output length": ["context", "new_in", "input", "output"],
    "+ the user's history (online)": ["context", "new_in", "input", "output", "user_sent", "user_share"],
    "categories, user's history (online)": ["category", "user_sent", "user_share"],
    "categories, user's share (hindsight)": ["category", "user_hindsight"],
}


def cell_columns(r: pl.DataFrame, vocab: dict[str, list[str]]) -> Codes:
    """Each feature of FEATURE_SETS as a small integer code (the labels of VOCAB's columns by their index)."""
    num = {c: r[c].cast(pl.Float64).to_numpy() for c in
           ("new_in_tokens", "input_tokens", "output_tokens", "user_sent", "user_share_online",
            "user_share_hindsight")}
    labels = {c: np.searchsorted(vocab[c], r[c].to_numpy()).astype(np.int64) for c in vocab}
    return {
        **labels,
        "new_in": _bins(num["new_in_tokens"], [20, 100, 500]),
        "input": _bins(num["input_tokens"], [500, 2000, 8000]),
        "output": _bins(num["output_tokens"], [100, 400, 1000]),
        "user_sent": _bins(num["user_sent"], [1, 5, 20, 100]),
        "user_share": _bins(num["user_share_online"], [0.2, 0.4, 0.6, 0.8]),
        "user_hindsight": _bins(num["user_share_hindsight"], [0.2, 0.4, 0.6, 0.8]),
    }


def auc(score: npt.NDArray[np.float64], y: npt.NDArray[np.bool_]) -> float:
    """Area under the ROC curve of SCORE for the labels Y (ties count half)."""
    ranks = rankdata(score)
    n1 = int(y.sum())
    n0 = len(y) - n1
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def cell_rates(train: Codes, y: npt.NDArray[np.bool_], test: Codes,
               features: list[str]) -> tuple[npt.NDArray[np.float64], int]:
    """Test requests' shrunk next-turn rate of their cell on the train requests; the number of train cells."""
    def keys(cols: Codes) -> npt.NDArray[np.int64]:
        k = np.zeros(len(cols[features[0]]), dtype=np.int64)
        for f in features:
            k = k * (int(max(train[f].max(), test[f].max())) + 1) + cols[f]
        return k
    ktr, kte = keys(train), keys(test)
    cells, inv = np.unique(ktr, return_inverse=True)
    n = np.bincount(inv).astype(np.float64)
    s = np.bincount(inv, weights=y.astype(np.float64))
    prior = float(y.mean())
    rate = (s + SHRINK * prior) / (n + SHRINK)
    pos = np.searchsorted(cells, kte).clip(0, len(cells) - 1)
    return np.where(cells[pos] == kte, rate[pos], prior), len(cells)


def logistic_scores(train: Codes, y: npt.NDArray[np.bool_], test: Codes,
                    features: list[str]) -> npt.NDArray[np.float64]:
    """Test requests' log-odds of a next turn under an additive logistic model of the features' bins
    (one-hot, L2 1e-3 per request), fitted on the train requests: the features combined without cells."""
    def design(cols: Codes) -> npt.NDArray[np.float64]:
        parts = [np.ones((len(cols[features[0]]), 1))]
        for f in features:
            width = int(max(train[f].max(), test[f].max())) + 1
            parts.append(np.eye(width)[cols[f]][:, 1:])
        return np.hstack(parts)
    xtr, xte, t = design(train), design(test), y.astype(np.float64)

    def loss(w: npt.NDArray[np.float64]) -> tuple[float, npt.NDArray[np.float64]]:
        z = xtr @ w
        p = 1.0 / (1.0 + np.exp(-z))
        value = float(np.mean(np.logaddexp(0.0, z) - t * z) + 1e-3 * w[1:] @ w[1:])
        grad = xtr.T @ (p - t) / len(t) + np.r_[0.0, 2e-3 * w[1:]]
        return value, grad
    w = minimize(loss, np.zeros(xtr.shape[1]), jac=True, method="L-BFGS-B").x
    return np.asarray(xte @ w, dtype=np.float64)


def main() -> None:
    requests = {seed: pl.read_parquet(ingested_run("to-c", 1.0, seed=seed) / "requests.parquet") for seed in (1, 2, 3)}
    context = fit_context(requests[1], Window(-np.inf, np.inf, include_end=True), "auto")
    by_seed = {seed: request_features(reqs, context) for seed, reqs in requests.items()}
    vocab = {c: sorted(set().union(*(f[c].to_list() for f in by_seed.values()))) for c in ("category", "context")}
    train = by_seed[1]
    ctr, ytr = cell_columns(train, vocab), train["has_next"].to_numpy()
    online = FEATURE_SETS["+ the user's history (online)"]
    print(f"context classes (fitted on seed 1): {context}")
    for seed in (2, 3):
        test = by_seed[seed]
        cte, yte = cell_columns(test, vocab), test["has_next"].to_numpy()
        later = test["turn"].fill_null(1).to_numpy() >= 2
        print(f"next turn after a request: seed 1 {ytr.mean():.3f}, seed {seed} {yte.mean():.3f} (later turns "
              f"{yte[later].mean():.3f}); fitted on seed 1, AUC on seed {seed} (0.5 = chance)")
        print(f"  {'features':40s} {'cells':>6s} {'AUC all':>8s} {'turn >= 2':>10s}")
        for name, feats in FEATURE_SETS.items():
            score, ncells = cell_rates(ctr, ytr, cte, feats)
            print(f"  {name:40s} {ncells:6d} {auc(score, yte):8.3f} {auc(score[later], yte[later]):10.3f}")
        score = logistic_scores(ctr, ytr, cte, online)
        print(f"  {'all online features, additive logistic':40s} {'-':>6s} {auc(score, yte):8.3f} "
              f"{auc(score[later], yte[later]):10.3f}")


if __name__ == "__main__":
    main()
