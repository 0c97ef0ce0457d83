"""The request stream the simulator replays: a run folder's blocks as dense integer arrays, optionally
regrouped to an engine's block size.

Regrouping trace blocks of T tokens to engine blocks of E tokens (vLLM caches only FULL blocks):
- E = g x T: engine block j covers trace blocks jg..jg+g-1 and is cached only when all of them exist and
  are full; its identity is the chain id of its last trace block (a chain id names the whole prefix).
- T = s x E: trace block k of t tokens yields floor(t / E) full engine blocks; identity = (chain id of
  trace block k, sub-index). A partial last trace block's sub-blocks get their own identities (the trace
  hashes the partial content, so kvtrace cannot know that they equal the full block's first sub-blocks).
Identities are renumbered densely 0..D-1 in order of first appearance.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property

import numpy as np
from numba import njit

from tongyi_trace.errors import InputError, UsageError
from tongyi_trace.policy.file import RequestContext
from tongyi_trace.run import RunTables
from tongyi_trace.trace.categories import context_categories
from tongyi_trace.trace.dense import DenseIds


@dataclass(frozen=True)
class Stream:
    """Requests in replay order; block ids dense in 0..num_ids-1."""

    req_off: np.ndarray  # int64[N+1]: blocks of request i are blk[req_off[i]:req_off[i+1]]
    blk: np.ndarray  # int64[R]
    ntok: np.ndarray  # int64[R]: tokens of the request in the block
    req_cat: np.ndarray  # int64[N]: index into categories
    req_time_s: np.ndarray  # float64[N]: arrival
    req_tokens: np.ndarray  # int64[N]: prompt tokens (denominator of the token hit ratio)
    categories: tuple[str, ...]
    num_ids: int
    block_size: int
    req_idx: np.ndarray  # int64[N]: req_idx in the run of each replayed request

    def __post_init__(self) -> None:
        # read-only views, whoever made the arrays (numpy, Polars, an executor's memory map): numba types
        # a read-only array apart, so every kernel over a stream compiles once, not once per origin
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray) and value.flags.writeable:
                object.__setattr__(self, f.name, readonly(value))

    @property
    def num_requests(self) -> int:
        """Requests in the stream."""
        return int(self.req_off.shape[0] - 1)

    @property
    def num_refs(self) -> int:
        """Block references in the stream."""
        return int(self.blk.shape[0])

    @cached_property
    def parent(self) -> np.ndarray:
        """int64[num_ids]: each block's parent (the block before it in the first request that uses it;
        -1 for a request's first block). Chain ids name a whole prefix, so every request agrees."""
        return parent_of_ids(self.req_off, self.blk, self.num_ids)

    def ideal_hits(self) -> int:
        """Block hits with an unlimited cache (each id hits after its first reference)."""
        return int(self.num_refs - self.num_ids)


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view of A (no copy)."""
    view = a.view()
    view.flags.writeable = False
    return view


def load_stream(tables: RunTables, req_idx: np.ndarray | None = None, context: RequestContext | None = None) -> Stream:
    """The run's requests (TABLES: all in arrival order, or REQ_IDX in the given order) as a Stream; categories
    are the run's, with the context classes of CONTEXT (a policy file's) appended when it is set."""
    prov = tables.provenance
    block_size = int(prov.get("block_size") or 0)
    if block_size <= 0:
        raise InputError(f"{tables.provenance_path}: field 'block_size' is missing; re-run 'kvtrace ingest'")
    blocks = tables.blocks(["req_idx", "pos", "chain_idx", "num_tokens"])
    reqs = tables.requests()
    reqs = reqs.with_columns(category=context_categories(reqs, context)).select(
        "req_idx", "arrival_s", "category", "input_tokens")
    n_all = reqs.height
    counts = np.bincount(blocks["req_idx"].to_numpy(), minlength=n_all).astype(np.int64)
    off_all = np.zeros(n_all + 1, np.int64)
    np.cumsum(counts, out=off_all[1:])
    chain = blocks["chain_idx"].to_numpy().astype(np.int64)
    ntok = blocks["num_tokens"].to_numpy().astype(np.int64)
    cats = reqs["category"].fill_null("all").to_numpy()
    names, cat_codes = np.unique(cats.astype(str), return_inverse=True)
    times = reqs["arrival_s"].to_numpy().astype(np.float64)
    if req_idx is None:
        sel = np.arange(n_all, dtype=np.int64)
    else:
        sel = np.asarray(req_idx, dtype=np.int64)
        if sel.size and (sel.min() < 0 or sel.max() >= n_all):
            raise UsageError(f"req_idx out of range 0..{n_all - 1} in {tables.requests_path}")
    lens = counts[sel]
    off = np.zeros(sel.size + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    gather = _gather_index(off_all, sel, off)
    ids, num_ids = densify(chain[gather])
    return Stream(off, ids, ntok[gather], cat_codes[sel].astype(np.int64), times[sel],
                  _req_sums(off, ntok[gather]), tuple(str(n) for n in names), num_ids, block_size, sel)


def stream_from_lists(requests: list[list[int]], *, num_tokens: list[list[int]] | None = None,
                      times_s: list[float] | None = None, categories: list[str] | None = None,
                      block_size: int = 16) -> Stream:
    """A Stream built from python lists of chain ids (tests and small examples)."""
    lens = np.array([len(r) for r in requests], np.int64)
    off = np.zeros(len(requests) + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    flat = np.array([b for r in requests for b in r], np.int64)
    ntok = (np.array([t for r in num_tokens for t in r], np.int64) if num_tokens is not None
            else np.full(flat.size, block_size, np.int64))
    cats = categories or ["all"] * len(requests)
    names, codes = np.unique(np.array(cats, dtype=str), return_inverse=True)
    times = np.array(times_s if times_s is not None else np.arange(len(requests)), np.float64)
    ids, num_ids = densify(flat)
    return Stream(off, ids, ntok, codes.astype(np.int64), times, _req_sums(off, ntok),
                  tuple(str(n) for n in names), num_ids, block_size, np.arange(len(requests), dtype=np.int64))


def densify(ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Renumber IDS to 0..D-1 in order of first appearance: ingest's numbering, trace/dense.DenseIds (the ids
    here are chain ids or already dense integers, whose low bits spread over its table)."""
    dense = DenseIds()
    return dense.assign(np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)), dense.num_distinct


def regroup(stream: Stream, engine_block_size: int) -> Stream:
    """STREAM with blocks regrouped to ENGINE_BLOCK_SIZE tokens (only full engine blocks kept)."""
    t = stream.block_size
    e = int(engine_block_size)
    if e <= 0:
        raise UsageError(f"--engine-block-size must be positive, got {e}")
    if e == t:
        return stream
    pos = _positions(stream.req_off)
    if e % t == 0:
        g = e // t
        keep = ((pos + 1) % g == 0) & (stream.ntok == t)
        lens = np.add.reduceat(keep.astype(np.int64), stream.req_off[:-1]) if stream.num_refs else None
        new_ids = stream.blk[keep]
    elif t % e == 0:
        s = t // e
        nsub = stream.ntok // e
        rep = np.repeat(np.arange(stream.num_refs, dtype=np.int64), nsub)
        starts = np.repeat(np.cumsum(nsub) - nsub, nsub)
        sub = np.arange(rep.size, dtype=np.int64) - starts
        new_ids = stream.blk[rep] * s + sub
        lens = np.add.reduceat(nsub, stream.req_off[:-1]) if stream.num_refs else None
    else:
        raise UsageError(f"--engine-block-size {e} must be a multiple or a divisor of the trace's "
                         f"block size {t}")
    n = stream.num_requests
    counts = np.zeros(n, np.int64)
    if lens is not None:
        nonempty = np.diff(stream.req_off) > 0
        counts[nonempty] = lens[nonempty]  # reduceat repeats the value at empty segments
    off = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=off[1:])
    ids, num_ids = densify(new_ids)
    return replace(stream, req_off=off, blk=ids, ntok=np.full(ids.size, e, np.int64), num_ids=num_ids,
                   block_size=e)


def _positions(req_off: np.ndarray) -> np.ndarray:
    r = int(req_off[-1])
    lens = np.diff(req_off)
    return np.arange(r, dtype=np.int64) - np.repeat(req_off[:-1], lens)


def _gather_index(off_all: np.ndarray, sel: np.ndarray, off: np.ndarray) -> np.ndarray:
    lens = np.diff(off)
    return np.repeat(off_all[sel], lens) + _positions(off)


def _req_sums(off: np.ndarray, ntok: np.ndarray) -> np.ndarray:
    c = np.zeros(ntok.size + 1, np.int64)
    np.cumsum(ntok, out=c[1:])
    return c[off[1:]] - c[off[:-1]]


def next_request_of_refs(req_off: np.ndarray, blk: np.ndarray, num_ids: int) -> np.ndarray:
    """For each reference, the index of the next request that references the same id (N if none)."""
    n = req_off.shape[0] - 1
    nxt = np.empty(blk.shape[0], np.int64)
    next_request_update(req_off, blk, np.full(num_ids, n, np.int64), 0, nxt)
    return nxt


@njit(cache=True)
def next_request_update(req_off: np.ndarray, blk: np.ndarray, seen: np.ndarray, first_req: int,
                        nxt: np.ndarray) -> None:
    """next_request_of_refs over one slice of whole requests, numbered from FIRST_REQ, taken last slice
    first (sim/chunked.py): NXT[i] = the next request referencing BLK[i], from SEEN[id] (the earliest
    request of the later slices that references id), which is then updated."""
    for r in range(req_off.shape[0] - 2, -1, -1):
        for i in range(req_off[r], req_off[r + 1]):
            nxt[i] = seen[blk[i]]
        for i in range(req_off[r], req_off[r + 1]):
            seen[blk[i]] = first_req + r


def parent_of_ids(req_off: np.ndarray, blk: np.ndarray, num_ids: int) -> np.ndarray:
    """For each id, the id before it in the first request that references it (-1: first block)."""
    par = np.full(num_ids, -2, np.int64)
    extend_parents(par, req_off, blk)
    return par


@njit(cache=True)
def extend_parents(par: np.ndarray, req_off: np.ndarray, blk: np.ndarray) -> None:
    """parent_of_ids over one more slice of whole requests (PAR: -2 = an id not referenced yet)."""
    for r in range(req_off.shape[0] - 1):
        for i in range(req_off[r], req_off[r + 1]):
            x = blk[i]
            if par[x] == -2:
                par[x] = blk[i - 1] if i > req_off[r] else -1
