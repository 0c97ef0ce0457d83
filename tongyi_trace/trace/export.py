"""`kvtrace export`: write a run folder back out as a trace file (Parquet or Bailian JSONL).

The Parquet form has the Bailian fields as columns (hash_ids a list column) and ingests back to
identical normalized tables: the round trip JSONL -> run -> Parquet -> run is lossless.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from tongyi_trace.atomic import atomic_path
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


def export_trace(run: RunDir, out: Path, force: bool = False) -> int:
    """Write the run's trace to OUT (.parquet or .jsonl by suffix) atomically (killed or out of space, an
    existing OUT stays whole); return the number of requests. An existing OUT is replaced only when FORCE,
    and never when it is the trace the run was ingested from."""
    check_not_run_table(out, "-o")
    if out.suffix not in (".parquet", ".jsonl"):
        raise UsageError(f"{out}: export writes .parquet or .jsonl; choose one of those suffixes")
    if out.exists() or out.is_symlink():
        source = run.provenance().get("source")
        if source and out.resolve() == Path(source).resolve():
            raise UsageError(f"-o {out}: is the trace this run was ingested from; export to another file")
        if not force:
            raise UsageError(f"-o {out}: exists; pass --force to replace it, or choose another file")
    table = trace_table(run)
    with atomic_path(out) as tmp:
        if out.suffix == ".parquet":
            arrow = table.to_arrow()
            meta = {PARQUET_BLOCK_SIZE_KEY: str(run.provenance()["block_size"])}
            pq.write_table(arrow.replace_schema_metadata({**(arrow.schema.metadata or {}), **meta}), tmp,
                           compression="zstd")
        else:
            (table.drop("user_id") if table["user_id"].null_count() == table.height else table).write_ndjson(tmp)
    return table.height
