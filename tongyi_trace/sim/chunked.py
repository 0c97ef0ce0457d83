"""The simulator over a run read in chunks: a trace larger than memory, replayed through one policy with
the kernel's state and one chunk of references in memory, never the whole stream (sim/stream.py's Stream
holds ~93 bytes per reference). The state has rows per cache slot, not per distinct block
(Cache(slotted=True), structs.py): bounded by the capacity (and S3-FIFO's ghost), beside a 4-byte slot
and an 8-byte parent per block id.

Chunks are whole requests read in order from the run's blocks.parquet (sorted by req_idx, pos), about
CHUNK_REFS references each; their block ids are the run's chain_idx, which ingest numbered densely in
order of first appearance, so they are the ids sim/stream.load_stream gives the whole run. The kernel
already serves request slices with its state carried between calls (simulate.Cache); here each call
gets its chunk's arrays, the parents of the ids seen so far (stream.extend_parents: an id's parent is
fixed at its first reference, before the kernel can insert it) and, for the oracle, the next use of
each of the chunk's references, computed out of core before the replay: one reverse pass over the
chunks (stream.next_request_update) writing int64 next-use times to a spill file inside the run folder
(removed after), read back chunk by chunk. The results equal simulate_policy's on the whole stream,
request for request (tests/sim/test_chunked.py).

A window of the run (REQUESTS = (first, stop): requests first..stop-1, a cold cache at its first) is replayed
the same way, over the row groups of blocks.parquet that hold it; simulate_chunked_many replays several
policies in one pass over the chunks (the fit's capacity-aware step, fit/tune.py).

Not streamed (UsageError): LFU (its queues are sized by the largest per-block count of the whole
stream), WA's guard and refit (simulate_guarded slices the whole stream: run WA with guard=false), the
engine's block size and shape, and tiers.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from tongyi_trace.budget import spill_dir as spill_folder
from tongyi_trace.budget import step
from tongyi_trace.errors import InputError, UsageError
from tongyi_trace.policy.file import PolicyParams, RequestContext
from tongyi_trace.run import RunDir
from tongyi_trace.sim.kernel import TIER_NONE
from tongyi_trace.sim.registry import Policy
from tongyi_trace.sim.simulate import Cache, PolicyResult
from tongyi_trace.sim.stream import Stream, extend_parents, next_request_update, readonly
from tongyi_trace.trace.categories import context_categories

NOT_STREAMED = frozenset({Policy.LFU.value})
ProgressFn = Callable[[str, int, int], None]  # (step, references done, references in all)


@dataclass(frozen=True)
class StreamShape(Stream):
    """The whole run as the policies' init hooks see it, without its references: the per-request arrays
    (N of them), the categories and the number of ids, NUM_REFS_TOTAL references, and REQ_OFF = [0, the
    longest request] (what a lazy heap is sized by)."""

    num_refs_total: int = 0
    num_requests_total: int = 0
    req0: int = 0  # the run's index of the first request (a window of the run starts past 0)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "req_tokens", self.req_tokens.copy())  # writable: the chunks fill it in

    @property
    def num_requests(self) -> int:
        """Requests in the run."""
        return self.num_requests_total

    @property
    def num_refs(self) -> int:
        """Block references in the run."""
        return self.num_refs_total


@dataclass(frozen=True)
class Chunk:
    """Requests FIRST_REQ..FIRST_REQ + n - 1 of the run, whole; REF0 = the run's position of their first reference."""

    first_req: int
    ref0: int
    req_off: np.ndarray  # int64[n + 1], from 0
    blk: np.ndarray  # int64: chain_idx
    ntok: np.ndarray  # int64

    @property
    def stop_req(self) -> int:
        """One past the chunk's last request."""
        return self.first_req + self.req_off.shape[0] - 1


def stream_shape(run: RunDir, context: RequestContext | None = None,
                 requests: tuple[int, int] | None = None) -> StreamShape:
    """The run's StreamShape: its requests' categories (with CONTEXT's classes, as load_stream), arrival
    times and lengths, from requests.parquet and provenance.json (the prompt tokens are filled in by the
    chunks, iter_chunks). REQUESTS = (first, stop): only requests first..stop-1 (the ids stay the run's)."""
    prov = run.provenance()
    block_size = int(prov.get("block_size") or 0)
    if block_size <= 0:
        raise InputError(f"{run.provenance_path}: field 'block_size' is missing; re-run 'kvtrace ingest'")
    reqs = run.requests()
    cats = reqs.with_columns(category=context_categories(reqs, context))["category"].fill_null("all").to_numpy()
    names, codes = np.unique(cats.astype(str), return_inverse=True)
    lo, hi = requests if requests is not None else (0, reqs.height)
    if not 0 <= lo <= hi <= reqs.height:
        raise UsageError(f"requests {lo}..{hi - 1} are not within the run's 0..{reqs.height - 1}")
    n = hi - lo
    lens = reqs["num_blocks"].to_numpy().astype(np.int64)[lo:hi]
    return StreamShape(
        req_off=np.array([0, int(lens.max()) if n else 0], np.int64), blk=np.zeros(0, np.int64),
        ntok=np.zeros(0, np.int64), req_cat=codes[lo:hi].astype(np.int64),
        req_time_s=reqs["arrival_s"].to_numpy().astype(np.float64)[lo:hi],
        req_tokens=np.zeros(n, np.int64), categories=tuple(str(x) for x in names),
        num_ids=int(prov["num_distinct_blocks"]), block_size=block_size,
        req_idx=np.arange(lo, hi, dtype=np.int64), num_refs_total=int(lens.sum()), num_requests_total=n,
        req0=lo)


def iter_chunks(run: RunDir, shape: StreamShape, chunk_refs: int) -> Iterator[Chunk]:
    """The run's requests in order (SHAPE's: the run's, or a window of them), in chunks of whole requests of
    about CHUNK_REFS references (a longer request is a chunk of its own); each request's prompt tokens are
    written into SHAPE.req_tokens. A chunk's first_req and ref0 count from SHAPE's first request."""
    n = shape.num_requests
    lo, hi = shape.req0, shape.req0 + n
    carry: list[np.ndarray] = []
    first_req, ref0 = 0, 0
    pf = pq.ParquetFile(run.blocks_path)
    batches = pf.iter_batches(batch_size=max(1, chunk_refs), row_groups=_row_groups(pf, lo, hi),
                              columns=["req_idx", "chain_idx", "num_tokens"])
    for batch in batches:
        cols = [batch.column(i).to_numpy() for i in range(3)]
        if cols[0].shape[0] and (int(cols[0][0]) < lo or int(cols[0][-1]) >= hi):  # a window's edge: its rows only
            if int(cols[0][0]) >= hi:
                break
            keep = (cols[0] >= lo) & (cols[0] < hi)
            cols = [c[keep] for c in cols]
            if not cols[0].shape[0]:
                continue
        if lo:
            cols[0] = cols[0] - lo
        if carry:
            cols = [np.concatenate([a, b]) for a, b in zip(carry, cols, strict=True)]
        req = cols[0]
        cut = int(np.searchsorted(req, req[-1], side="left"))  # the last request may go on in the next batch
        if cut == 0:  # one request so far (longer than a chunk: it ends where a larger req_idx starts)
            carry = cols
            continue
        carry = [c[cut:] for c in cols]
        chunk = _chunk(run, shape, first_req, int(req[-1]), ref0, [c[:cut] for c in cols])
        first_req, ref0 = chunk.stop_req, ref0 + cut
        yield chunk
    if carry or first_req < n:
        cols = carry or [np.zeros(0, np.int64)] * 3
        chunk = _chunk(run, shape, first_req, n, ref0, cols)
        yield chunk
        ref0 += cols[0].shape[0]
    if ref0 != shape.num_refs:
        raise InputError(f"{run.blocks_path}: {ref0:,} block references, but requests.parquet's num_blocks "
                         f"add up to {shape.num_refs:,}; re-run 'kvtrace ingest'")


def _row_groups(pf: pq.ParquetFile, lo: int, hi: int) -> list[int]:
    """The row groups of blocks.parquet PF that may hold requests LO..HI-1 (by their req_idx statistics;
    every group that has none)."""
    col = pf.schema_arrow.get_field_index("req_idx")
    out = []
    for g in range(pf.metadata.num_row_groups):
        st = pf.metadata.row_group(g).column(col).statistics
        if st is None or not st.has_min_max or (int(st.max) >= lo and int(st.min) < hi):
            out.append(g)
    return out


def _chunk(run: RunDir, shape: StreamShape, first_req: int, stop_req: int, ref0: int,
           cols: list[np.ndarray]) -> Chunk:
    req, blk, ntok = (np.asarray(c, dtype=np.int64) for c in cols)
    if req.shape[0] and (int(req[0]) < first_req or int(req[-1]) >= stop_req or bool(np.any(np.diff(req) < 0))
                         or int(blk.min()) < 0 or int(blk.max()) >= shape.num_ids):
        raise InputError(f"{run.blocks_path}: rows are not sorted by req_idx, or a chain_idx is out of "
                         f"0..{shape.num_ids - 1}; re-run 'kvtrace ingest'")
    counts = np.bincount(req - first_req, minlength=stop_req - first_req).astype(np.int64)
    off = np.zeros(stop_req - first_req + 1, np.int64)
    np.cumsum(counts, out=off[1:])
    sums = np.zeros(ntok.shape[0] + 1, np.int64)
    np.cumsum(ntok, out=sums[1:])
    shape.req_tokens[first_req:stop_req] = sums[off[1:]] - sums[off[:-1]]
    # read-only views, as a Stream's: the kernel then runs in the specialization the whole-stream simulator compiled
    return Chunk(first_req, ref0, readonly(off), readonly(blk), readonly(ntok))


def write_next_uses(run: RunDir, shape: StreamShape, chunk_refs: int, path: Path,
                    on_progress: ProgressFn | None = None) -> int:
    """Every reference's next request (stream.next_request_of_refs of the whole run) as int64 into the file
    PATH, out of core: the chunks' block ids spilled beside it, then read back last chunk first. Returns
    the oracle's peak live set (capacity.peak_live_blocks of the whole run), counted on the way."""
    ids_path = path.with_suffix(".ids")
    spans: list[tuple[int, int, np.ndarray]] = []  # (first_req, ref0, req_off) per chunk
    with step("simulate: next uses, forward pass"), ids_path.open("wb") as f:
        for c in iter_chunks(run, shape, chunk_refs):
            c.blk.tofile(f)
            spans.append((c.first_req, c.ref0, c.req_off))
            if on_progress:
                on_progress("next uses: reading", c.ref0 + c.blk.shape[0], shape.num_refs)
    n = shape.num_requests
    seen = np.full(shape.num_ids, n, np.int64)
    live = np.zeros(n + 1, np.int64)  # peak_live_blocks' difference array
    done = 0
    with step("simulate: next uses, reverse pass"), path.open("wb") as out:
        out.truncate(shape.num_refs * 8)
        for first_req, ref0, off in reversed(spans):
            m = int(off[-1])
            blk = np.fromfile(ids_path, np.int64, count=m, offset=ref0 * 8)
            nxt = np.empty(m, np.int64)
            next_request_update(off, blk, seen, first_req, nxt)
            used = nxt < n
            req = np.repeat(np.arange(first_req, first_req + off.shape[0] - 1, dtype=np.int64), np.diff(off))
            np.add.at(live, req[used], 1)
            np.add.at(live, nxt[used], -1)
            out.seek(ref0 * 8)
            nxt.tofile(out)
            done += m
            if on_progress:
                on_progress("next uses: reverse pass", done, shape.num_refs)
    ids_path.unlink()
    return max(0, int(np.cumsum(live[:n]).max())) if n else 0


@dataclass(frozen=True)
class ChunkedTask:
    """One simulation of a chunked pass: POLICY at CAPACITY_BLOCKS with PARAMS (simulate_chunked's)."""

    policy: str | Policy
    capacity_blocks: int
    params: dict[str, Any] | None = None


def simulate_chunked(run: RunDir, policy: str | Policy, capacity_blocks: int, *, chunk_refs: int,
                     params: dict[str, Any] | None = None, fit: PolicyParams | None = None,
                     spill_dir: Path | None = None, next_uses: Path | None = None, timing: bool = True,
                     on_progress: ProgressFn | None = None, requests: tuple[int, int] | None = None) -> PolicyResult:
    """POLICY at CAPACITY_BLOCKS over RUN's requests in arrival order (simulate_policy over load_stream(RUN)),
    reading about CHUNK_REFS references at a time (module doc). The oracle reads its next uses from the
    file NEXT_USES (write_next_uses), or spills them into a temporary folder inside SPILL_DIR (default
    RUN/sim/), removed after. ON_PROGRESS(step, done, total) after each chunk. REQUESTS = (first, stop):
    only that window of the run, from a cold cache (simulate_policy over load_stream(RUN, first..stop-1))."""
    return simulate_chunked_many(run, [ChunkedTask(policy, capacity_blocks, params)], chunk_refs=chunk_refs,
                                 fit=fit, spill_dir=spill_dir, next_uses=next_uses, timing=timing,
                                 on_progress=on_progress, requests=requests)[0]


def simulate_chunked_many(run: RunDir, tasks: list[ChunkedTask], *, chunk_refs: int,
                          fit: PolicyParams | None = None, spill_dir: Path | None = None,
                          next_uses: Path | None = None, timing: bool = True, on_progress: ProgressFn | None = None,
                          requests: tuple[int, int] | None = None) -> list[PolicyResult]:
    """simulate_chunked of every one of TASKS in one pass over the chunks (each chunk read once, served to
    every task's cache, as many at once as there are cores; their states are all in memory at once): the
    results in TASKS order."""
    names = [str(t.policy.value if isinstance(t.policy, Policy) else t.policy).lower() for t in tasks]
    for name in names:
        if name in NOT_STREAMED:
            raise UsageError(f"policy {name} is not simulated in chunks: its queues need the whole stream's counts")
    shape = stream_shape(run, fit.context if fit else None, requests)
    oracle = Policy.ORACLE.value in names
    caches = [Cache(shape, t.policy, t.capacity_blocks, params=t.params, fit=fit,
                    next_req=np.zeros(1, np.int64) if name == Policy.ORACLE.value else None, timing=timing,
                    slotted=True)
              for t, name in zip(tasks, names, strict=True)]
    for cache in caches:
        if cache.params.get("guard") or cache.params.get("refit_s"):
            raise UsageError(f"policy {cache.spec.name} with its guard or refit is not simulated in chunks: "
                             "set guard=false and refit_s=0 (--set wa.guard=false)")
    what = caches[0].spec.name if len(caches) == 1 else f"{len(caches)} policies"
    with ExitStack() as stack:
        nxt_path = next_uses
        if oracle and next_uses is None:  # a spill folder only for the oracle's next uses
            tmp = stack.enter_context(spill_folder(Path(tempfile.mkdtemp(prefix="chunked-",
                                                                         dir=spill_dir or run.subdir("sim")))))
            nxt_path = tmp / "next_uses.i64"
            write_next_uses(run, shape, chunk_refs, nxt_path, on_progress)
        parent = np.full(shape.num_ids, -2, np.int64)
        empty = readonly(np.zeros(0, np.int64))  # compile (or load) the kernel outside the timed calls, as Cache.warm
        for cache in caches:
            _serve_chunk(cache, shape, Chunk(0, 0, readonly(np.zeros(1, np.int64)), empty, empty), parent)
        # the kernels release the GIL: a pass's caches are served a chunk side by side, one thread a core
        pool = stack.enter_context(ThreadPoolExecutor(min(len(caches), os.cpu_count() or 1)))
        with step(f"simulate {what}: replay in chunks"):
            for c in iter_chunks(run, shape, chunk_refs):
                extend_parents(parent, c.req_off, c.blk)  # read only while the chunk is served
                nxt = (np.fromfile(nxt_path, np.int64, count=c.blk.shape[0], offset=c.ref0 * 8)
                       if oracle and nxt_path is not None else None)
                for cache in caches:
                    if cache.spec.name == Policy.ORACLE.value:
                        cache.nxt = nxt
                if len(caches) == 1:
                    _serve_chunk(caches[0], shape, c, parent)
                else:
                    for f in [pool.submit(_serve_chunk, cache, shape, c, parent) for cache in caches]:
                        f.result()
                if on_progress:
                    on_progress(f"simulate {what}", c.ref0 + c.blk.shape[0], shape.num_refs)
    return [cache.result() for cache in caches]


def _serve_chunk(cache: Cache, shape: StreamShape, c: Chunk, parent: np.ndarray) -> None:
    """Cache.serve over one chunk: the kernel with the chunk's arrays and the state carried on."""
    lo, hi = c.first_req, c.stop_req
    lens = np.diff(c.req_off)
    bk, hp, g, gf, qs, rl = cache.state
    t0 = time.perf_counter()
    cache.account(lo, hi, t0, cache.kernel(
        c.req_off, c.blk, c.ntok, shape.req_cat[lo:hi], shape.req_time_s[lo:hi], lens, lens,
        np.zeros(hi - lo, np.int64), cache.capacity_blocks, bk, hp, g, gf, qs, cache.ip, cache.fp, cache.cw,
        cache.nxt, parent, rl, cache.imap, cache.sl, cache.leaf_only, cache.timing, cache.low, cache.lrel,
        cache.out, TIER_NONE))

