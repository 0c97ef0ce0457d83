"""Section: the per-category reuse model F_w(d) = p_w (1 - exp(-lambda_w d)) that `kvtrace fit` wrote
into the policy file: fitted vs empirical (Kaplan-Meier) CDFs per category and the train/test table
(paper Fig 12-15 fits, Fig 29 stability across hours). Artifacts: fit/train_test.json, fit/cdf.parquet
(docs/artifacts/fit.md), and the setting to run per capacity from fit/policy.json."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np
import polars as pl

from tongyi_trace.policy.file import choice_table, load_policy
from tongyi_trace.report import fmt
from tongyi_trace.report.artifacts import read_parquet, read_versioned, require
from tongyi_trace.report.figures import Fig, new_figure
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.run import RunDir
from tongyi_trace.schemas import FIT_TABLE_SCHEMA

REMEDY = "re-run 'kvtrace fit RUN_DIR'"
MAX_PANELS = 2  # per-category CDF panels shown (most samples first), `default` always; the rest in the table
# (window, column) -> trace name, line style
CURVES: list[tuple[str, str, str, dict[str, Any]]] = [
    ("train", "empirical_cdf", "train: empirical (Kaplan-Meier)", {"color": "#1f77b4"}),
    ("train", "policy_cdf", "train: policy fit", {"color": "#1f77b4", "dash": "dash"}),
    ("test", "empirical_cdf", "test: empirical", {"color": "#d62728"}),
    ("test", "policy_cdf", "test: train fit's prediction", {"color": "#d62728", "dash": "dash"}),
]


def build(run: RunDir) -> list[Section]:
    """The fit section, or nothing when `kvtrace fit` was not run."""
    path = run.path / "fit" / "train_test.json"
    doc = read_versioned(path, FIT_TABLE_SCHEMA, REMEDY)
    if doc is None:
        return []
    rows: list[dict[str, Any]] = require(doc, "rows", path, REMEDY)
    train = doc.get("train") or {}
    test = doc.get("test")
    s = Section(key="fit", title="Reuse model per category (kvtrace fit)", paper_ref="Fig 12-15, 29",
                definition="F_w(d) = p_w (1 - exp(-lambda_w d)) by maximum likelihood over the accesses of "
                           "category w in the train window, accesses whose next use falls after the window "
                           "right-censored; KS = largest gap to the Kaplan-Meier CDF. Categories with too few "
                           "samples take their type's pooled fit, then the fit over all (fallback).")
    cdf = read_parquet(run.path / "fit" / "cdf.parquet", REMEDY)
    panels: list[tuple[str, str]] = []
    if cdf is not None:
        for i, row in enumerate(_panel_rows(rows)):
            cat = str(row["category"])
            fig = _panel(cdf.filter(pl.col("category") == cat), test is not None)
            if fig is not None:
                s.figures[f"cat{i}"] = fig
                panels.append((f"cat{i}", cat))
    s.tables["params"] = _params_table(rows)
    policy_path = run.path / "fit" / "policy.json"
    choices = load_policy(policy_path).choices if policy_path.is_file() else []
    if choices:
        columns, choice_rows = choice_table(choices)
        s.tables["choices"] = Table(columns=columns, rows=choice_rows)
    if test is not None:
        s.tables["test"] = _test_table(rows)
    # KS over categories fitted on their own data that saw reuses (no reuse at all fits trivially).
    own = [r for r in rows if r.get("category") != "default" and not r.get("fallback")
           and r.get("train_num_observed")]
    ks_train = [float(r["train_ks"]) for r in own if r.get("train_ks") is not None]
    ks_test = [float(r["test_ks_policy"]) for r in own if r.get("test_ks_policy") is not None]
    opts = doc.get("options") or {}
    s.values = {
        "panels": panels, "num_hidden": max(0, len(rows) - len(panels)),
        "num_categories": sum(1 for r in rows if r.get("category") != "default"),
        "num_fallback": sum(1 for r in rows if r.get("fallback") and r.get("category") != "default"),
        "train": f"{fmt.num(train.get('start_s'), 6)}-{fmt.num(train.get('end_s'), 6)} s",
        "test": f"{fmt.num(test.get('start_s'), 6)}-{fmt.num(test.get('end_s'), 6)} s" if test else None,
        "min_samples": fmt.count(opts.get("min_samples")),
        "ks_train_median": fmt.ratio(statistics.median(ks_train), 3) if ks_train else "n/a",
        "ks_test_median": fmt.ratio(statistics.median(ks_test), 3) if ks_test else None,
    }
    s.headline = [Headline("reuse-model KS distance, median over own-fit categories (train)",
                           s.values["ks_train_median"])]
    if s.values["ks_test_median"] is not None:
        s.headline.append(Headline("same, train fit on the held-out test window", s.values["ks_test_median"],
                                   "similar hours look alike (Fig 29)"))
    return [s]


def _panel_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cats = sorted((r for r in rows if r.get("category") != "default"),
                  key=lambda r: (-(r.get("train_num_samples") or 0), str(r.get("category"))))
    shown = sorted(cats[:MAX_PANELS], key=lambda r: str(r.get("category")))  # most samples kept, by name
    return [r for r in rows if r.get("category") == "default"] + shown


def _panel(df: pl.DataFrame, with_test: bool) -> Fig | None:
    if df.height == 0:
        return None
    fig = new_figure(x_title="d (s)", y_title="P(reused within d)", height_px=280,
                     margin={"l": 50, "r": 10, "t": 10, "b": 40}, showlegend=False)
    fig.update_xaxes(type="log")
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    for window, col, name, line in CURVES:
        if window == "test" and not with_test:
            continue
        part = df.filter((pl.col("window") == window) & (pl.col("d_s") > 0)).sort("d_s")
        y = part[col].to_numpy()
        keep = np.isfinite(y.astype(float))
        if not keep.any():
            continue
        fig.add_scatter(x=part["d_s"].to_numpy()[keep], y=y[keep], mode="lines", name=name, line=line,
                        legendgroup=name)
    return fig if fig.data else None


def _params_table(rows: list[dict[str, Any]]) -> Table:
    return Table(
        columns=["category", "samples", "reused", "p", "mean reuse", "life_s", "KS", "parameters from"],
        rows=[[str(r.get("category")), fmt.count(r.get("train_num_samples")), fmt.count(r.get("train_num_observed")),
               fmt.ratio(r.get("reuse_prob"), 3), fmt.seconds(r.get("mean_reuse_s")), fmt.seconds(r.get("life_s")),
               fmt.ratio(r.get("train_ks"), 3),
               ("fallback: " if r.get("fallback") else "") + str(r.get("pool") or "own")] for r in rows])


def _test_table(rows: list[dict[str, Any]]) -> Table:
    return Table(
        columns=["category", "train p", "train mean reuse", "test samples", "test p (own fit)",
                 "test mean reuse (own fit)", "KS own fit on test", "KS train fit on test"],
        rows=[[str(r.get("category")), fmt.ratio(r.get("reuse_prob"), 3), fmt.seconds(r.get("mean_reuse_s")),
               fmt.count(r.get("test_num_samples")), fmt.ratio(r.get("test_reuse_prob"), 3),
               fmt.seconds(r.get("test_mean_reuse_s")), fmt.ratio(r.get("test_ks_own"), 3),
               fmt.ratio(r.get("test_ks_policy"), 3)] for r in rows])
