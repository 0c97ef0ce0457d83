"""`kvtrace export`: write a run folder back out as a trace file (Parquet or Bailian JSONL).

The Parquet form has the Bailian fields as columns (hash_ids a list column) and ingests back to
identical normalized tables: the round trip JSONL -> run -> Parquet -> run is lossless.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from tongyi_trace.errors import UsageError
from tongyi_trace.run import RunDir, check_not_run_table
from tongyi_trace.trace.parquet_reader import PARQUET_BLOCK_SIZE_KEY


def trace_table(run: RunDir) -> pl.DataFrame:
    """The run's requests in arrival order with the Bailian field names and their hash_ids lists."""
    hashes = (run.blocks(["req_idx", "pos", "block_id"]).sort("req_idx", "pos")
              .group_by("req_idx", maintain_order=True).agg(pl.col("block_id").alias("hash_ids")))
    req = run.requests().join(hashes, on="req_idx", how="left").sort("req_idx")
    return req.select(
        "chat_id", "parent_chat_id",
        pl.col("arrival_s").alias("timestamp"),
        pl.col("input_tokens").alias("input_length"),
        pl.col("output_tokens").alias("output_length"),
        "type", "turn",
        pl.col("hash_ids").fill_null(pl.lit([], dtype=pl.List(pl.Int64))),
        "user_id",
    )


def export_trace(run: RunDir, out: Path) -> int:
    """Write the run's trace to OUT (.parquet or .jsonl by suffix); return the number of requests."""
    check_not_run_table(out, "-o")
    table = trace_table(run)
    if out.suffix == ".parquet":
        arrow = table.to_arrow()
        meta = {PARQUET_BLOCK_SIZE_KEY: str(run.provenance()["block_size"])}
        pq.write_table(arrow.replace_schema_metadata({**(arrow.schema.metadata or {}), **meta}), out,
                       compression="zstd")
    elif out.suffix == ".jsonl":
        (table.drop("user_id") if table["user_id"].null_count() == table.height else table).write_ndjson(out)
    else:
        raise UsageError(f"{out}: export writes .parquet or .jsonl; choose one of those suffixes")
    return table.height
