"""Differential test against libCacheSim (PyPI libcachesim) on streams without prefix sharing: every
request is one block, so prefix semantics and pinning change nothing and a textbook cache must agree
with libCacheSim's hit count exactly. LRU, FIFO and LFU do. S3-FIFO and GDSF are left out on purpose:
kvtrace's S3-FIFO follows the SOSP'23 paper's Algorithm 1 and libCacheSim's S3FIFO.c is a later variant
(move-to-main threshold 2, insertion into the main FIFO before the first eviction, a 2-bit clock in the
main FIFO); kvtrace's GDSF prices a block by its prefill cost at its position, libCacheSim's by size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.sim.simulate import simulate_policy
from tongyi_trace.sim.stream import stream_from_lists

lcs = pytest.importorskip("libcachesim")


def _oracle_general(ids: np.ndarray, path: Path) -> None:
    """libCacheSim's oracleGeneral binary: (u32 time, u64 id, u32 size, i64 next access)."""
    nxt = np.full(ids.size, -1, np.int64)
    last: dict[int, int] = {}
    for i in range(ids.size - 1, -1, -1):
        nxt[i] = last.get(int(ids[i]), -1)
        last[int(ids[i])] = i
    rec = np.zeros(ids.size, dtype=np.dtype([("t", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")]))
    rec["t"] = np.arange(ids.size)
    rec["id"] = ids + 1
    rec["size"] = 1
    rec["next"] = np.where(nxt < 0, np.iinfo(np.int64).max, nxt)
    rec.tofile(path)


@settings(max_examples=examples(40), deadline=None)
@given(ids=st.lists(st.integers(0, 40), min_size=1, max_size=300), capacity=st.integers(2, 30),
       policy=st.sampled_from([("lru", "LRU"), ("fifo", "FIFO"), ("lfu", "LFU")]))
def test_single_block_streams_agree_with_libcachesim(tmp_path_factory: pytest.TempPathFactory, ids: list[int],
                                                      capacity: int, policy: tuple[str, str]) -> None:
    ours, theirs = policy
    arr = np.asarray(ids, np.int64)
    path = tmp_path_factory.mktemp("og") / "trace.oracleGeneral"
    _oracle_general(arr, path)
    reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE,
                             lcs.ReaderInitParam(ignore_obj_size=True))
    miss_ratio, _ = getattr(lcs, theirs)(cache_size=capacity).process_trace(reader)
    got = simulate_policy(stream_from_lists([[i] for i in ids], times_s=list(range(len(ids)))), ours, capacity)
    assert got.num_hits == round((1.0 - miss_ratio) * len(ids))
