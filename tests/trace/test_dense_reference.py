"""Dense renumbering (chain id -> chain_idx 0, 1, 2, ... in order of first appearance) has one reference,
trace/dense.DenseIds, the numbering ingest writes. The two other paths are held to it, on real traces and
on random streams: queries/ingest_blocks.sql (ingest's re-keying of a trace out of time order, in DuckDB
so that it spills) and sim/stream.densify (the simulator's renumbering of a selection or a regrouping)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.duckdb_setup import duckdb_connect
from tongyi_trace.resources import read_query
from tongyi_trace.run import open_run
from tongyi_trace.sim.stream import densify
from tongyi_trace.trace.chain import chain_ids
from tongyi_trace.trace.dense import DenseIds
from tongyi_trace.trace.ingest import ingest_trace


def reference(chain: np.ndarray, chunk_sizes: list[int] | None = None) -> np.ndarray:
    """DenseIds over CHAIN, fed in chunks of CHUNK_SIZES (as ingest feeds it chunk by chunk)."""
    dense, out, start = DenseIds(), [], 0
    for size in [*(chunk_sizes or []), chain.size]:
        out.append(dense.assign(chain[start:start + size]))
        start = min(start + size, chain.size)
    return np.concatenate(out)


def _check_ingested(trace: Path, run_dir: Path) -> list[int]:
    """Ingest TRACE (out of time order: re-keyed by ingest_blocks.sql) and hold chain_idx to the reference;
    returns chain_idx in arrival order."""
    ingest_trace(trace, run_dir)
    run = open_run(run_dir)
    assert run.provenance()["findings"]["timestamps_out_of_order"] > 0  # the SQL path ran
    blocks = run.blocks(["req_idx", "pos", "chain_id", "chain_idx"]).sort("req_idx", "pos")
    chain = blocks["chain_id"].to_numpy()
    ref = reference(chain)
    np.testing.assert_array_equal(blocks["chain_idx"].to_numpy(), ref)
    np.testing.assert_array_equal(densify(chain)[0], ref)
    return [int(i) for i in ref]


def _shuffled(lines: list[str], path: Path, seed: int) -> Path:
    order = np.random.default_rng(seed).permutation(len(lines))
    path.write_text("".join(lines[i] + "\n" for i in order))
    return path


def test_tiny_trace_reversed(tiny_bailian_path: Path, tmp_path: Path) -> None:
    lines = [ln for ln in tiny_bailian_path.read_text().splitlines() if ln.strip()]
    trace = tmp_path / "reversed.jsonl"
    trace.write_text("\n".join(lines[::-1]) + "\n")
    # by hand, in time order: [1,2,3] [1,2] [1,2,4,5] [2,1,6] [1,2,4,5,7] [1,2,4,5,7,8]
    assert _check_ingested(trace, tmp_path / "run") == [0, 1, 2, 0, 1, 0, 1, 3, 4, 5, 6, 7, 0, 1, 3, 4, 8,
                                                        0, 1, 3, 4, 8, 9]


def test_mooncake_conversation_shuffled(mooncake_conversation_path: Path, tmp_path: Path) -> None:
    lines = mooncake_conversation_path.read_text().splitlines()[:3000]
    assert all(json.loads(ln)["hash_ids"] for ln in lines[:5])
    assert max(_check_ingested(_shuffled(lines, tmp_path / "conv.jsonl", 13), tmp_path / "run")) > 10_000


def _sql_rekey(con: object, requests: list[list[int]], file_order: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """ingest_blocks.sql over REQUESTS (arrival order) written in FILE_ORDER: (chain ids, chain_idx) in
    arrival order, the way ingest calls it (file_blocks keyed by file position, req_order mapping it)."""
    rows = [(k, pos, b, c) for k, r in enumerate(file_order)
            for pos, (b, c) in enumerate(zip(requests[r], _chains(requests[r]), strict=True))]
    cols = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
    file_blocks = pa.table({"req_idx": pa.array(cols[0], pa.int64()), "pos": pa.array(cols[1], pa.int64()),
                            "block_id": pa.array(cols[2], pa.int64()), "chain_id": pa.array(cols[3], pa.int64()),
                            "num_tokens": pa.array([16] * len(rows), pa.int64())})
    req_order = pa.table({"raw_idx": pa.array(range(len(file_order)), pa.int64()),
                          "req_idx": pa.array(file_order, pa.int64())})
    con.register("file_blocks", file_blocks)  # type: ignore[attr-defined]
    con.register("req_order", req_order)  # type: ignore[attr-defined]
    out = con.sql(read_query("ingest_blocks")).fetchnumpy()  # type: ignore[attr-defined]
    return np.asarray(out["chain_id"]), np.asarray(out["chain_idx"])


def _chains(blocks: list[int]) -> list[int]:
    return chain_ids(np.array(blocks, np.int64), np.array([0, len(blocks)], np.int64)).tolist()


requests_st = st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=6), min_size=1, max_size=30)


@settings(max_examples=examples(80), deadline=None)
@given(requests=requests_st, seed=st.integers(0, 2**32 - 1), cuts=st.lists(st.integers(0, 20), max_size=4))
def test_random_streams(requests: list[list[int]], seed: int, cuts: list[int]) -> None:
    chain = np.array([c for r in requests for c in _chains(r)], np.int64)
    ref = reference(chain, cuts)
    first_seen: dict[int, int] = {}
    by_hand = [first_seen.setdefault(c, len(first_seen)) for c in chain.tolist()]
    assert ref.tolist() == by_hand  # the reference is the definition
    assert densify(chain)[0].tolist() == by_hand and densify(chain)[1] == len(first_seen)
    file_order = np.random.default_rng(seed).permutation(len(requests)).tolist()
    with tempfile.TemporaryDirectory() as spill:
        con = duckdb_connect(Path(spill), "256MB", 1)
        try:
            sql_chain, sql_idx = _sql_rekey(con, requests, file_order)
        finally:
            con.close()
    assert sql_chain.tolist() == chain.tolist() and sql_idx.tolist() == by_hand


def test_many_batches_grow_the_table() -> None:
    """Past the first batch the ids go to the compiled table, which grows from 16 slots to ~2^17 here: the
    numbering is the first-appearance one whatever the batches (uniform 64-bit ids, negatives included, and
    dense small integers, whose low bits alone would collide)."""
    rng = np.random.default_rng(7)
    for pool in (rng.integers(-(2**63), 2**63 - 1, 60_000, dtype=np.int64), np.arange(60_000, dtype=np.int64)):
        ids = rng.choice(pool, 200_000)
        first_seen: dict[int, int] = {}
        by_hand = [first_seen.setdefault(c, len(first_seen)) for c in ids.tolist()]
        for cuts in ([0], [5, 1_000, 0, 30_000, 30_000, 60_000]):
            dense = DenseIds()
            assert reference(ids, cuts).tolist() == by_hand
            dense.assign(ids[:0])
            dense.assign(ids)
            assert dense.num_distinct == len(first_seen)
