"""The one DuckDB session setup of kvtrace (ingest's re-keying pass and the characterization analyses).

An in-memory database bounded by a memory limit that spills to a temporary directory beyond it, so a
trace larger than memory still runs; insertion order is not preserved (the queries say ORDER BY where
order matters), and no progress bar is drawn (stdout belongs to --json).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb


def duckdb_connect(tmp_dir: Path, memory_limit: str = "4GB", threads: int = 2) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection that spills to TMP_DIR under MEMORY_LIMIT (e.g. "4GB", "2048MB")."""
    import duckdb  # loaded only by the steps that query: not by every ingest

    con = duckdb.connect(":memory:", config={"memory_limit": memory_limit, "threads": threads,
                                             "temp_directory": str(tmp_dir), "preserve_insertion_order": False})
    con.execute("SET enable_progress_bar = false")
    return con
