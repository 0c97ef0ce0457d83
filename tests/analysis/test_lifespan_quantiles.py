"""The lifespan percentiles are interpolated from DuckDB's exact histogram of lifespans (lifespan_values.sql,
a group-by that spills; analysis/lifespan.py `lifespan_quantiles`): equal to the bit to quantile_cont over
every block (queries/lifespan_quantiles.sql, the reference, which holds every lifespan in memory at once)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tongyi_trace.analysis.common import AnalysisOptions, open_context
from tongyi_trace.analysis.lifespan import QUANTILES, lifespan_quantiles
from tongyi_trace.run import RunDir
from tongyi_trace.trace.ingest import ingest_trace


def _both(run: RunDir) -> tuple[pl.DataFrame, pl.DataFrame]:
    with open_context(run.tables(), AnalysisOptions()) as ctx:
        ctx.ensure("chains")
        ref = ctx.query("lifespan_quantiles", qs=list(QUANTILES))
        got = lifespan_quantiles(ctx.query("lifespan_values"), QUANTILES)
    return ref, got


def test_tiny_trace(tiny_bailian_path: Path, tmp_path: Path) -> None:
    ingest_trace(tiny_bailian_path, tmp_path / "run")
    ref, got = _both(RunDir(tmp_path / "run"))
    assert got.equals(ref) and ref.height >= 2  # the whole run and its categories


def test_mooncake_conversation(mooncake_conversation_run: Path) -> None:
    ref, got = _both(RunDir(mooncake_conversation_run))
    assert got.equals(ref)
    whole = got.filter(pl.col("category").is_null()).row(0, named=True)
    assert whole["num_blocks"] > 1000 and whole["num_reused_blocks"] > 0
    assert whole["lifespan_q_s"][2] > whole["lifespan_q_s"][0]  # P99 above P50
