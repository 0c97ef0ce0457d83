"""Spatial locality: stride x offset ideal-hit heatmap (paper Fig 16-18; paper-notes item 8).

Offset o and stride s run over 0%, 10%, ..., 90% and 10%, ..., 100% of a request (o + s <= 100%).
For a window (o, s), a block reference at position pos of a request with num_blocks blocks is
CACHED (kept after the request) only when its relative position pos / num_blocks lies in [o, o + s);
a later reference hits when an earlier request cached the same prefix-chained block AND every block
before it in the request hit too (prefix matching: the first miss ends the hits of a request). The
value is the resulting infinite-cache hit ratio; (o = 0, s = 100%) equals the ideal hit ratio.

How it is computed, exactly and in one pass:
- o > 0: position 0 (relative position 0) is never cached, so no request ever matches its first block
  and the hit ratio is exactly 0.
- o = 0: the windows are nested. A reference caches its block for every stride s > pos / num_blocks,
  i.e. from stride tenth need = floor(10 pos / num_blocks) + 1. Keep per block the smallest `need` of
  its earlier references; a reference then hits for every stride >= the running maximum of those values
  over its request's positions 0..pos (and never when one of them was never seen). One compiled pass over
  blocks.parquet in (req_idx, pos) order, batch by batch, counts hits per (type, stride), holding a byte
  per distinct block: linear in the trace, whatever its length.
Also per request type. Query spatial_requests.sql gives each request's size and type.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow.parquet as pq
from numba import njit

from tongyi_trace.analysis.common import AnalysisContext, AnalysisResult, ratio
from tongyi_trace.errors import InputError

NAME = "spatial"
STEPS = 10  # windows in tenths of a request
UNSEEN = np.int8(STEPS + 1)
MAX_REQUESTS = np.iinfo(np.int32).max


def windows() -> list[tuple[int, int]]:
    """(offset, stride) pairs in tenths of a request: offset 0..9, stride 1..10, offset + stride <= 10."""
    return [(o, s) for s in range(1, STEPS + 1) for o in range(0, STEPS - s + 1)]


def _first_unsorted(req: npt.NDArray[np.int32], pos: npt.NDArray[np.int32]) -> int:
    """The first row breaking the (req_idx, pos) order, or -1."""
    bad = np.flatnonzero((req[1:] < req[:-1]) | ((req[1:] == req[:-1]) & (pos[1:] <= pos[:-1])))
    return int(bad[0]) + 1 if bad.shape[0] else -1


@njit(cache=True)
def _head_hits_batch(req: np.ndarray, pos: np.ndarray, chain: np.ndarray, req_blocks: np.ndarray,
                     req_type: np.ndarray, need: np.ndarray, hits: np.ndarray, carry: np.ndarray) -> None:
    """The module doc's o = 0 pass over one batch of references in (req_idx, pos) order: NEED[block] = the
    smallest stride (tenths) at which an earlier reference cached it (UNSEEN: none), HITS[type, k] += the
    references hitting from stride k; CARRY = (request, running maximum, still matching) across batches."""
    cur, run_max, matching = carry[0], carry[1], carry[2]
    for i in range(req.shape[0]):
        r = req[i]
        c = chain[i]
        if r != cur:
            cur, run_max, matching = r, 0, 1
        if matching:
            nc = need[c]
            if nc == UNSEEN:
                matching = 0
            else:
                run_max = max(run_max, nc)
                hits[req_type[r], run_max] += 1
        k = STEPS * pos[i] // req_blocks[r] + 1
        if k < need[c]:
            need[c] = k
    carry[0], carry[1], carry[2] = cur, run_max, matching


def _head_window_hits(batches: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], req_blocks: np.ndarray,
                      req_type: np.ndarray, num_chains: int, num_types: int, where: str = "blocks") -> np.ndarray:
    """hits[t, k]: references of type t whose prefix is cached once the stride reaches k tenths (k <= 10),
    over BATCHES of (req_idx, pos, chain_idx) in (req_idx, pos) order: one pass holding a byte per block
    (chain_idx < NUM_CHAINS) and one batch, linear in the trace. A row out of order, or a chain_idx or
    req_idx out of range, is an InputError naming WHERE."""
    need = np.full(num_chains, UNSEEN, np.int8)
    hits = np.zeros((num_types, STEPS + 1), np.int64)
    carry = np.array([-1, 0, 0], np.int64)
    last = (-1, -1)
    at = 0
    for req, pos, chain in batches:
        if not req.shape[0]:
            continue
        bad = _first_unsorted(req, pos)
        if bad < 0 and (int(req[0]), int(pos[0])) <= last:
            bad = 0
        if bad >= 0:
            raise InputError(f"{where}: row {at + bad} breaks the (req_idx, pos) order; re-run 'kvtrace ingest'")
        if int(chain.min()) < 0 or int(chain.max()) >= num_chains or int(req[-1]) >= req_blocks.shape[0]:
            raise InputError(f"{where}: a chain_idx or req_idx is out of the run's range; re-run 'kvtrace ingest'")
        _head_hits_batch(req, pos, chain, req_blocks, req_type, need, hits, carry)
        last = (int(req[-1]), int(pos[-1]))
        at += req.shape[0]
    return hits


def _block_batches(path: str) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """req_idx, pos, chain_idx of blocks.parquet, batch by batch (file order)."""
    for batch in pq.ParquetFile(path).iter_batches(columns=["req_idx", "pos", "chain_idx"], batch_size=1 << 20):
        yield tuple(np.array(batch.column(i).to_numpy(), np.int64) for i in range(3))  # type: ignore[misc]


def spatial(ctx: AnalysisContext) -> AnalysisResult:
    """Ideal hit ratio when only blocks in the relative window [o, o+s) of each request are cached."""
    res = AnalysisResult(
        NAME, "Spatial locality (stride x offset)", "Fig 16-18",
        "Ideal prefix hit ratio when each request caches only its blocks whose relative position "
        "pos/num_blocks lies in [offset, offset + stride); prefix matching still applies.")
    reqs = ctx.query("spatial_requests")
    req_blocks = reqs["num_blocks"].to_numpy().astype(np.int64)
    num_refs = int(req_blocks.sum())
    if reqs.height >= MAX_REQUESTS or num_refs == 0:
        res.headline = {"num_block_refs": num_refs}
        if num_refs == 0:
            return res
        raise InputError(f"{ctx.tables.requests_path}: too many requests for the spatial pass (>= 2^31)")
    type_names = reqs["type"].fill_null("(none)").to_list()
    names = sorted(set(type_names))
    code = {n: i for i, n in enumerate(names)}
    req_type = np.array([code[t] for t in type_names], np.int64)
    counted = [0]

    def batches() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        for b in _block_batches(str(ctx.tables.blocks_path)):
            counted[0] += b[0].shape[0]
            yield b

    num_chains = int(ctx.tables.provenance["num_distinct_blocks"])
    # hits at stride k tenths (offset 0) = references whose prefix was cached at some stride <= k
    head = np.cumsum(_head_window_hits(batches(), req_blocks, req_type, num_chains, len(names),
                                       str(ctx.tables.blocks_path)), axis=1)
    if counted[0] != num_refs:
        raise InputError(f"{ctx.tables.blocks_path}: {counted[0]} block rows but the requests' num_blocks sum to "
                         f"{num_refs}; re-run 'kvtrace ingest'")
    wins = windows()
    hits = np.stack([head[:, s] if o == 0 else np.zeros(len(names), np.int64) for o, s in wins])
    blocks_per_type = np.bincount(req_type, weights=req_blocks, minlength=len(names)).astype(np.int64)
    rows = []
    for w, (o, s) in enumerate(wins):
        total_hits = int(hits[w].sum())
        rows.append({"offset_pct": o * 10, "stride_pct": s * 10, "type": None, "num_blocks": num_refs,
                     "num_hit_blocks": total_hits, "hit_ratio": total_hits / num_refs})
        if ctx.flag("has_types"):
            for t, name in enumerate(names):
                nb = int(blocks_per_type[t])
                rows.append({"offset_pct": o * 10, "stride_pct": s * 10, "type": name, "num_blocks": nb,
                             "num_hit_blocks": int(hits[w, t]), "hit_ratio": ratio(int(hits[w, t]), nb)})
    table = pl.DataFrame(rows, schema={"offset_pct": pl.Int64, "stride_pct": pl.Int64, "type": pl.Utf8,
                                       "num_blocks": pl.Int64, "num_hit_blocks": pl.Int64,
                                       "hit_ratio": pl.Float64})
    res.tables["heatmap"] = table
    overall = table.filter(pl.col("type").is_null())
    at = {(r["offset_pct"], r["stride_pct"]): r["hit_ratio"] for r in overall.iter_rows(named=True)}
    res.headline = {
        "num_block_refs": num_refs,
        "full_window_hit_ratio": at[(0, 100)],
        "head_50pct_hit_ratio": at[(0, 50)],
        "tail_50pct_hit_ratio": at[(50, 50)],
        "best_partial_window": next(
            ({"offset_pct": r["offset_pct"], "stride_pct": r["stride_pct"], "hit_ratio": r["hit_ratio"]}
             for r in overall.sort(["hit_ratio", "stride_pct", "offset_pct"],
                                  descending=[True, False, False]).iter_rows(named=True) if r["stride_pct"] < 100),
            None),
    }
    if not ctx.flag("has_types"):
        res.absent_parts["by_type"] = "the trace has no request types"
    return res
