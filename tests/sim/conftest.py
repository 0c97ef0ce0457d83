"""Helpers of the simulator tests: hand-made run folders following docs/architecture.md."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tongyi_trace.run import RUN_SCHEMA


def write_run(path: Path, requests: list[list[int]], *, block_size: int = 16,
              tokens: list[list[int]] | None = None, times_s: list[float] | None = None,
              categories: list[str] | None = None, output_tokens: list[int] | None = None) -> Path:
    """A run folder whose request i references the chain ids REQUESTS[i] (dense renumbering done here)."""
    path.mkdir(parents=True, exist_ok=True)
    n = len(requests)
    toks = tokens or [[block_size] * len(r) for r in requests]
    first: dict[int, int] = {}
    rows = []
    for i, (r, t) in enumerate(zip(requests, toks, strict=True)):
        for pos, (c, nt) in enumerate(zip(r, t, strict=True)):
            first.setdefault(c, len(first))
            rows.append({"req_idx": i, "pos": pos, "block_id": c, "chain_id": c, "chain_idx": first[c],
                         "num_tokens": nt})
    schema = {k: pl.Int64 for k in ("req_idx", "pos", "block_id", "chain_id", "chain_idx", "num_tokens")}
    pl.DataFrame(rows, schema=schema).write_parquet(path / "blocks.parquet")
    pl.DataFrame({
        "req_idx": np.arange(n), "chat_id": np.arange(n), "parent_chat_id": np.full(n, -1),
        "session_id": np.arange(n), "user_id": [None] * n,
        "arrival_s": np.array(times_s if times_s is not None else np.arange(n), np.float64),
        "input_tokens": [sum(t) for t in toks], "output_tokens": output_tokens or [1] * n,
        "type": [None] * n, "turn": [None] * n, "category": categories or ["all"] * n,
        "num_blocks": [len(r) for r in requests],
    }, schema_overrides={"user_id": pl.Utf8, "type": pl.Utf8, "turn": pl.Int64}).write_parquet(
        path / "requests.parquet")
    (path / "provenance.json").write_text(json.dumps({
        "schema": RUN_SCHEMA, "source": "hand-made", "format": "test", "block_size": block_size,
        "num_requests": n, "num_block_refs": len(rows), "num_distinct_blocks": len(first)}))
    return path


def synth_run(folder: Path, seed: int, num_requests: int, duration_s: float = 600.0) -> Path:
    """NUM_REQUESTS to-C requests (profile seed SEED) over DURATION_S, synthesized and ingested into FOLDER/run."""
    from tongyi_trace.trace.ingest import ingest_trace
    from tongyi_trace.trace.synth import synth_to_file

    synth_to_file("to-c", seed, folder / "t.jsonl", num_requests=num_requests, duration_s=duration_s)
    ingest_trace(folder / "t.jsonl", folder / "run")
    return folder / "run"


@pytest.fixture
def make_run(tmp_path: Path) -> Callable[..., Path]:
    """write_run into a fresh folder under tmp_path."""
    counter = iter(range(1000))

    def make(requests: list[list[int]], **kw: object) -> Path:
        return write_run(tmp_path / f"run{next(counter)}", requests, **kw)  # type: ignore[arg-type]

    return make
