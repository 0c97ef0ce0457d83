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
  its references in earlier requests; a reference then hits for every stride >= the running maximum of
  those values over its request's positions 0..pos (and never when one of them was never seen). A few
  whole-array passes (numpy) over blocks.parquet in (req_idx, pos) order count hits per (type, stride).
Also per request type. Query spatial_requests.sql gives each request's size and type.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow.parquet as pq

from tongyi_trace.analysis.common import AnalysisContext, AnalysisResult, ratio
from tongyi_trace.errors import InputError

NAME = "spatial"
STEPS = 10  # windows in tenths of a request
UNSEEN = np.int8(STEPS + 1)
MAX_REQUESTS = np.iinfo(np.int32).max


def windows() -> list[tuple[int, int]]:
    """(offset, stride) pairs in tenths of a request: offset 0..9, stride 1..10, offset + stride <= 10."""
    return [(o, s) for s in range(1, STEPS + 1) for o in range(0, STEPS - s + 1)]


def _head_window_hits(req: npt.NDArray[np.int32], pos: npt.NDArray[np.int32], chain: npt.NDArray[np.int32],
                      req_blocks: npt.NDArray[np.int64], req_type: npt.NDArray[np.int32], num_chains: int,
                      num_types: int) -> npt.NDArray[np.int64]:
    """hits[t, k]: references of type t whose prefix is cached once the stride reaches k tenths (k <= 10).

    References in (req_idx, pos) order. Small values (k <= 11) ride in the low 4 bits of a key whose high
    bits are the group (block, or request), so a running maximum of the keys is a running maximum (or, of
    15 - k, minimum) within each group: no Python loop over references."""
    it = np.int32 if max(num_chains, req_blocks.shape[0]) < 1 << 26 else np.int64
    k = pos.astype(np.int64)
    k *= STEPS
    k //= req_blocks[req]
    need: npt.NDArray[np.signedinteger[Any]] = k.astype(it)
    need += 1  # the stride (tenths) from which the reference caches its block
    del k
    order = np.argsort(chain, kind="stable")  # each block's references, in request order
    by_block = chain[order]
    key: npt.NDArray[np.signedinteger[Any]] = by_block.astype(it)
    key <<= 4
    key |= 15 - need[order]
    np.maximum.accumulate(key, out=key)  # low bits: 15 - the smallest need of the block's references so far
    same = by_block[1:] == by_block[:-1]
    seen = np.full(order.shape[0], UNSEEN, it)
    seen[1:][same] = 15 - (key[:-1][same] & 15)
    prior = np.empty_like(seen)
    prior[order] = seen  # the smallest need among the block's references in earlier requests (UNSEEN: none)
    del order, by_block, key, same, seen
    run: npt.NDArray[np.signedinteger[Any]] = req.astype(it)
    run <<= 4
    run |= prior
    np.maximum.accumulate(run, out=run)
    run &= 15  # the largest prior need over the request's positions so far (UNSEEN once one was never seen)
    hit = run != UNSEEN
    return np.bincount(req_type[req[hit]].astype(np.int64) * (STEPS + 1) + run[hit],
                       minlength=num_types * (STEPS + 1)).reshape(num_types, STEPS + 1)


def _first_unsorted(req: npt.NDArray[np.int32], pos: npt.NDArray[np.int32]) -> int:
    """The first row breaking the (req_idx, pos) order, or -1."""
    bad = np.flatnonzero((req[1:] < req[:-1]) | ((req[1:] == req[:-1]) & (pos[1:] <= pos[:-1])))
    return int(bad[0]) + 1 if bad.shape[0] else -1


def _read_blocks(path: str, num_refs: int) -> tuple[npt.NDArray[np.int32], ...]:
    """req_idx, pos, chain_idx of blocks.parquet as int32 arrays, filled batch by batch (file order)."""
    cols = ("req_idx", "pos", "chain_idx")
    arrays = tuple(np.empty(num_refs, np.int32) for _ in cols)
    at = 0
    pf = pq.ParquetFile(path)
    for batch in pf.iter_batches(columns=list(cols), batch_size=1 << 20):
        n = batch.num_rows
        if at + n > num_refs:
            raise InputError(f"{path}: more block rows than the requests' num_blocks ({num_refs}); "
                             "re-run 'kvtrace ingest'")
        for arr, col in zip(arrays, cols, strict=True):
            arr[at:at + n] = batch.column(col).to_numpy()
        at += n
    if at != num_refs:
        raise InputError(f"{path}: {at} block rows but the requests' num_blocks sum to {num_refs}; "
                         "re-run 'kvtrace ingest'")
    return arrays


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
    req_type = np.array([code[t] for t in type_names], np.int32)
    req, pos, chain = _read_blocks(str(ctx.tables.blocks_path), num_refs)
    bad = _first_unsorted(req, pos)
    if bad >= 0:
        raise InputError(f"{ctx.tables.blocks_path}: row {bad} breaks the (req_idx, pos) order; "
                         "re-run 'kvtrace ingest'")
    num_chains = int(chain.max()) + 1
    # hits at stride k tenths (offset 0) = references whose prefix was cached at some stride <= k
    head = np.cumsum(_head_window_hits(req, pos, chain, req_blocks, req_type, num_chains, len(names)), axis=1)
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
