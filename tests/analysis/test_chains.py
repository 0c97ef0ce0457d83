"""The analyses' `chains` table is computed with numpy (analysis/chains.py); queries/chains_table.sql is its
reference: both are held equal, row for row, on the tiny fixture, on a real Mooncake trace and on random
multi-turn traces (including ones ingested out of time order)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.analysis.chains import chains_table, write_chains_table
from tongyi_trace.analysis.common import AnalysisOptions, open_context
from tongyi_trace.resources import read_query
from tongyi_trace.run import RunDir, load_provenance
from tongyi_trace.trace.ingest import ingest_trace

from .conftest import write_jsonl


def _both(run: RunDir) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(the SQL reference, the numpy table), both sorted by chain_idx."""
    prov = load_provenance(run)
    with open_context(run.tables(), AnalysisOptions()) as ctx:
        ctx.con.execute(read_query("chains_table"))
        ref = ctx.con.sql("SELECT * FROM chains ORDER BY chain_idx").pl()
    return ref, pl.from_arrow(chains_table(run.tables(), int(prov["num_distinct_blocks"])))  # type: ignore[return-value]


def test_tiny_trace(tiny_bailian_path: Path, tmp_path: Path) -> None:
    ingest_trace(tiny_bailian_path, tmp_path / "run")
    ref, got = _both(RunDir(tmp_path / "run"))
    assert ref.height == 10  # the fixture's 10 distinct prefix-chained blocks (provenance num_distinct_blocks)
    assert got.equals(ref)


def test_mooncake_conversation(mooncake_conversation_run: Path, tmp_path: Path) -> None:
    ref, got = _both(RunDir(mooncake_conversation_run))
    assert ref.height > 1000
    assert got.equals(ref)
    # what `kvtrace analyze` reads: the same rows written out of core in slices (here 997 chains each)
    num_chains = int(load_provenance(RunDir(mooncake_conversation_run))["num_distinct_blocks"])
    path = write_chains_table(RunDir(mooncake_conversation_run).tables(), num_chains, tmp_path / "c.parquet", 997)
    assert pq.ParquetFile(path).metadata.num_row_groups >= num_chains // 997
    assert pl.read_parquet(path).equals(ref)


@settings(max_examples=examples(25), deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_random_traces(tmp_path_factory: object, seed: int, shuffled: bool) -> None:
    rng = np.random.default_rng(seed)
    rows, heads = [], []
    for i in range(int(rng.integers(1, 40))):
        parent = int(rng.integers(0, i)) if i and rng.random() < 0.6 else -1
        base = heads[parent] if parent >= 0 else [int(b) for b in rng.integers(0, 5, size=int(rng.integers(0, 4)))]
        blocks = base + [int(b) for b in rng.integers(0, 50, size=int(rng.integers(1, 6)))]
        heads.append(blocks)
        rows.append({"chat_id": i, "parent_chat_id": parent, "timestamp": float(rng.integers(0, 20)),
                     "input_length": 16 * len(blocks) - int(rng.integers(0, 16)), "output_length": 5,
                     "type": str(rng.choice(["text", "image"])), "turn": 1 if parent < 0 else 2,
                     "hash_ids": blocks})
    if not shuffled:
        rows.sort(key=lambda r: r["timestamp"])
    tmp = Path(str(tmp_path_factory.mktemp("chains")))  # type: ignore[attr-defined]
    ingest_trace(write_jsonl(tmp / "t.jsonl", rows), tmp / "run")
    ref, got = _both(RunDir(tmp / "run"))
    assert got.equals(ref)
