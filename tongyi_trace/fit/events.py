"""Reuse-time samples of a run inside a time window, right-censored at the window's end.

Each block access (a row of blocks.parquet) gives one sample of the reuse time d of the accessing
request's category w: the time until the same block (chain_idx) is next accessed, by the next request
in arrival order holding it (paper section 3, "Reuse time", Fig 12-15; the same definition as
queries/reuse_events.sql, computed here with one stable numpy sort because the fit must stay within
seconds on a 2-hour trace; tests/fit/test_events.py checks the two agree).

Inside a window [start_s, end_s), an access at time a is a sample when start_s <= a < end_s; it is
OBSERVED with d = next_access_s - a when the next access happens by end_s, and otherwise
RIGHT-CENSORED at c = end_s - a (we only know that d > c, or that the block is never reused): dropping
or truncating those would bias the fit towards short reuse times.

All blocks of one request share the access time, so accesses are aggregated to (request, next request)
pairs with a count: the fit and the Kaplan-Meier estimator work on weighted samples.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import polars as pl
from numba import njit

from tongyi_trace.artifact_set import STAGING_PREFIX
from tongyi_trace.budget import spill_dir
from tongyi_trace.errors import UsageError
from tongyi_trace.executor import PartitionOptions
from tongyi_trace.policy.file import RequestContext
from tongyi_trace.policy.reuse_model import Samples
from tongyi_trace.run import RunTables
from tongyi_trace.trace.categories import CONTEXT_COLUMNS, context_categories
from tongyi_trace.trace.partition import map_partitions, read_partition, read_split, split_partitions

T = TypeVar("T")
LINK_BYTES_PER_REF = 64  # link_accesses' peak a reference (columns read, stable sort, pair keys, counting)
LINK_COLUMNS = ("req_idx", "chain_idx")  # what linking reads of blocks.parquet
KEPT_BYTES_PER_REF = 8  # the linked accesses kept (sorted req_idx and chain_idx, int32)
Int64s = npt.NDArray[np.int64]
Ints = npt.NDArray[np.signedinteger[Any]]  # int32 or int64
Linked = tuple[Int64s, Int64s, Ints, Ints]  # pair keys, pair counts, sorted req_idx, sorted chain_idx


@dataclass(frozen=True)
class Window:
    """A time window [start_s, end_s) on the trace's clock (its arrival_s; [start_s, end_s] when the
    window reaches the trace's end, so that the last requests' accesses count as samples). ORIGIN_S is
    the trace's first arrival: users give and read windows in seconds from it (parse_window, to_json),
    so a trace whose clock does not start at 0 (a slice, epoch timestamps) takes the same options."""

    start_s: float
    end_s: float
    include_end: bool = False
    origin_s: float = 0.0

    def contains(self, t_s: np.ndarray) -> np.ndarray:
        """Mask of the times T_S inside the window."""
        upper = t_s <= self.end_s if self.include_end else t_s < self.end_s
        return (t_s >= self.start_s) & upper

    def to_json(self) -> dict[str, float]:
        """{"start_s", "end_s"} in seconds from the trace start, as in the policy file."""
        return {"start_s": self.start_s - self.origin_s, "end_s": self.end_s - self.origin_s}

    def __str__(self) -> str:
        """START:END in seconds from the trace start, as the options take it."""
        j = self.to_json()
        return f"{j['start_s']:g}:{j['end_s']:g}"


def seconds_text(value_s: float) -> str:
    """Seconds as the window options take them, to a tenth: 7200, 7199.9, 1700000000."""
    return f"{round(value_s, 1):.12g}"


def trace_span(length_s: float) -> str:
    """The words that give a trace's length in window terms (messages about --train, --test, --holdout)."""
    return f"the trace spans 0:{seconds_text(length_s)} s from its first request"


def parse_window(text: str, trace_start_s: float, trace_end_s: float, option: str) -> Window:
    """Parse START:END, seconds from the trace start TRACE_START_S (its first arrival; either side may be
    empty: the trace's start / end), into a Window on the trace's clock."""
    start_txt, sep, end_txt = text.partition(":")
    if not sep:
        raise UsageError(f"{option} {text!r}: expected START:END in seconds, e.g. {option} 0:3600")
    try:
        start_s = float(start_txt) if start_txt.strip() else 0.0
        end_s = float(end_txt) if end_txt.strip() else trace_end_s - trace_start_s
    except ValueError:
        raise UsageError(f"{option} {text!r}: START and END must be numbers of seconds, "
                         f"e.g. {option} 0:3600") from None
    length_s = trace_end_s - trace_start_s
    if np.isfinite(start_s) and start_s > length_s:
        raise UsageError(f"{option} {text}: starts past the trace's end ({trace_span(length_s)}); give {option} "
                         "a window inside the trace")
    if not (np.isfinite(start_s) and np.isfinite(end_s)) or start_s < 0 or end_s <= start_s:
        past = " (START is past the trace's end)" if np.isfinite(start_s) and start_s >= length_s else ""
        raise UsageError(f"{option} {text!r}: need 0 <= START < END (seconds from the trace start){past}; the "
                         f"trace lasts {length_s:g} s, so e.g. {option} 0:{length_s / 2:g}")
    end_abs_s = trace_start_s + end_s if end_txt.strip() else trace_end_s  # no round trip through the offset
    return Window(trace_start_s + start_s, end_abs_s, include_end=end_abs_s >= trace_end_s, origin_s=trace_start_s)


@dataclass(frozen=True)
class Accesses:
    """Every block access of a run with its next access, ready to be cut into windows.

    Per request: arrival_s, category code. Per (request, next request) pair: count of blocks.
    Per access, sorted by (chain_idx, req_idx): req_idx and chain_idx (for block lifespans)."""

    arrival_s: np.ndarray  # float64 per request
    category_code: np.ndarray  # int64 per request, index into category_names
    category_names: list[str]
    category_type: dict[str, str | None]
    pair_req: np.ndarray  # int64
    pair_next: np.ndarray  # int64, -1 = never accessed again
    pair_count: np.ndarray  # int64
    sorted_req: np.ndarray  # int32 (int64 past 2^31 requests) per access, sorted by (chain_idx, req_idx)
    sorted_chain: np.ndarray  # int32 (int64 past 2^31 chains) per access, same order

    @property
    def trace_start_s(self) -> float:
        """Arrival time of the first request (the trace's clock)."""
        return float(self.arrival_s.min()) if len(self.arrival_s) else 0.0

    @property
    def trace_end_s(self) -> float:
        """Arrival time of the last request."""
        return float(self.arrival_s.max()) if len(self.arrival_s) else 0.0


def load_accesses(tables: RunTables, context: RequestContext | None = None,
                  partitions: PartitionOptions | None = None) -> Accesses:
    """Read the run's TABLES and link every block access to the block's next access (vectorized). Categories
    are the run's, with CONTEXT's classes appended when it is set. With PARTITIONS, the linking runs in that
    many partitions of the chained block ids on its executor (trace/partition.py), merged exactly: the same
    Accesses but for the order of the chains in sorted_req / sorted_chain (each chain's run is the same)."""
    req = pl.read_parquet(tables.requests_path, columns=[*CONTEXT_COLUMNS, "type"]).sort("req_idx")
    req = req.with_columns(category=context_categories(req, context)).select(
        "req_idx", "arrival_s", "category", "type")
    num_requests = req.height
    if num_requests and not np.array_equal(req["req_idx"].to_numpy(), np.arange(num_requests)):
        raise UsageError(f"{tables.requests_path}: column 'req_idx' is not 0..N-1; re-run 'kvtrace ingest'")
    names_and_types = req.select("category", "type").unique().sort("category")
    names = [str(c) for c in names_and_types["category"].unique(maintain_order=True).to_list()]
    code_of = {name: i for i, name in enumerate(names)}
    codes = req["category"].replace_strict(code_of, return_dtype=pl.Int64).to_numpy() if num_requests \
        else np.empty(0, dtype=np.int64)
    types = {str(c): (None if t is None else str(t)) for c, t in names_and_types.iter_rows()}

    if partitions is None:
        keys, counts, sorted_req, sorted_chain = link_accesses(
            pl.read_parquet(tables.blocks_path, columns=["req_idx", "chain_idx"]), num_requests)
    else:
        keys, counts, sorted_req, sorted_chain = _link_partitions(tables, num_requests, partitions)
    return Accesses(
        arrival_s=req["arrival_s"].to_numpy().astype(np.float64),
        category_code=codes.astype(np.int64),
        category_names=names,
        category_type=types,
        pair_req=keys // (num_requests + 1),
        pair_next=keys % (num_requests + 1) - 1,
        pair_count=counts,
        sorted_req=sorted_req,
        sorted_chain=sorted_chain,
    )


def link_accesses(blocks: pl.DataFrame, num_requests: int) -> Linked:
    """Link every access (BLOCKS: req_idx, chain_idx of every reference of each chain present, in arrival
    order; pass it as a temporary: its columns are released here as soon as they are sorted) to its chain's
    next access: (pair keys req x (NUM_REQUESTS + 1) + next + 1 ascending, their counts, and the accesses'
    req_idx and chain_idx sorted by (chain_idx, req_idx), int32 when the run's sizes allow)."""
    small = np.int32 if num_requests < np.iinfo(np.int32).max else np.int64  # the accesses kept: 8 bytes, not 16
    req_idx: Ints = blocks["req_idx"].to_numpy().astype(small)
    chain_all = blocks["chain_idx"].to_numpy()
    narrow = not chain_all.size or int(chain_all.max()) < np.iinfo(np.int32).max
    chain: Ints = chain_all.astype(np.int32) if narrow else chain_all
    del blocks, chain_all
    # blocks.parquet is sorted by (req_idx, pos): a STABLE sort by chain keeps each chain's accesses in
    # arrival order, so an access's next access is the following row when it has the same chain.
    order = np.argsort(chain, kind="stable")
    sorted_req: Ints = req_idx[order]
    sorted_chain: Ints = chain[order]
    del order, req_idx, chain
    key = sorted_req.astype(np.int64) * (num_requests + 1)  # + the next access's request + 1 (0: none)
    if len(sorted_req) > 1:
        same = sorted_chain[1:] == sorted_chain[:-1]
        key[:-1] += np.where(same, sorted_req[1:].astype(np.int64) + 1, 0)
        del same
    pairs = pl.Series("key", key).value_counts(name="count").sort("key")
    del key
    return (pairs["key"].to_numpy(), pairs["count"].to_numpy().astype(np.int64), sorted_req, sorted_chain)


def budget_partitions(num_refs: int, budget_bytes: int) -> int:
    """Partitions of the linking (load_accesses) that keep its peak within BUDGET_BYTES for NUM_REFS
    references: 1 (no partitions) when the whole run links at once (LINK_BYTES_PER_REF a reference while it
    is sorted; the linked accesses it keeps, KEPT_BYTES_PER_REF, are held whole either way)."""
    room = budget_bytes - num_refs * KEPT_BYTES_PER_REF
    need = num_refs * LINK_BYTES_PER_REF
    if need <= budget_bytes:
        return 1
    return max(2, -(-need // max(room, budget_bytes // 8)))


def link_partition(part: int, shared: Mapping[str, Any]) -> Linked:
    """link_accesses over partition PART of the run's chains (an executor task; SHARED: tables,
    num_partitions, num_requests)."""
    split = shared.get("split")  # the partitions' files (one machine), else a scan of the table for its rows
    rows = (read_split(split[part]) if split is not None else
            read_partition(shared["tables"], part, int(shared["num_partitions"]), LINK_COLUMNS, by_block_id=False)[0])
    frame = pl.from_arrow(rows)
    del rows
    assert isinstance(frame, pl.DataFrame)
    return link_accesses(frame, int(shared["num_requests"]))


def _link_partitions(tables: RunTables, num_requests: int, opts: PartitionOptions) -> Linked:
    """link_accesses of the whole run from its partitions: pair counts added (keys ascending), the sorted
    accesses concatenated in partition order (each chain's run whole, in one partition). On the local
    executor the table is first split into a file per partition in one pass (a spill folder inside the run,
    removed after); on Ray each worker scans it for its partition."""
    with contextlib.ExitStack() as stack:
        shared: dict[str, Any] = {"num_requests": num_requests}
        if opts.executor.kind == "local":
            run_dir = tables.blocks_path.parent
            tmp = stack.enter_context(spill_dir(Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}link-", dir=run_dir))))
            shared["split"] = split_partitions(tables, opts.num_partitions, LINK_COLUMNS, tmp)
        parts = [list(p) for p in map_partitions(link_partition, tables, opts, shared, "linking block accesses with")]

    def joined(col: int) -> np.ndarray:
        """Column COL of every partition, concatenated; the partitions' pieces released."""
        out = np.concatenate([p[col] for p in parts])
        for p in parts:
            p[col] = None
        return out

    pairs = (pl.DataFrame({"key": joined(0), "count": joined(1)})
             .group_by("key").agg(pl.col("count").sum()).sort("key"))
    return (pairs["key"].to_numpy(), pairs["count"].to_numpy().astype(np.int64), joined(2), joined(3))


def window_samples(acc: Accesses, window: Window) -> dict[str, Samples]:
    """Per category, the (censored) reuse-time samples of the accesses inside WINDOW."""
    access_s = acc.arrival_s[acc.pair_req]
    inside = window.contains(access_s)
    req, nxt, cnt = acc.pair_req[inside], acc.pair_next[inside], acc.pair_count[inside]
    access_s = access_s[inside]
    next_s = np.where(nxt >= 0, acc.arrival_s[np.maximum(nxt, 0)], np.inf)
    observed = next_s <= window.end_s
    time_s = np.where(observed, next_s - access_s, window.end_s - access_s)
    return _by_category(acc.category_names, acc.category_code[req],
                        lambda m: Samples(time_s[m], observed[m], cnt[m]))


def block_lifespans(acc: Accesses, window: Window) -> dict[str, np.ndarray]:
    """Per category, the lifespans (s) of the blocks reused inside WINDOW: last access - first access
    there (paper Fig 19-20: a block lives from its first access to its last reuse), attributed to the
    category of the block's first access there. Blocks accessed once in the window are left out."""
    inside = window.contains(acc.arrival_s)  # per request: no array per access beyond the two kept
    num_codes = len(acc.category_names)
    counts = _count_reused(acc.sorted_req, acc.sorted_chain, inside, acc.category_code, num_codes)
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    lifespans_s = _lifespans_by_category(acc.sorted_req, acc.sorted_chain, inside, acc.category_code,
                                         acc.arrival_s, bounds)
    return {name: lifespans_s[bounds[i]:bounds[i + 1]] for i, name in enumerate(acc.category_names)
            if bounds[i + 1] > bounds[i]}


@njit(cache=True, nogil=True)
def _count_reused(req: np.ndarray, chain: np.ndarray, inside: np.ndarray, code: np.ndarray,
                  num_codes: int) -> np.ndarray:
    """Per category CODE of its first access inside the window, the chains of REQ / CHAIN (accesses sorted
    by (chain, req)) with at least two accesses by requests INSIDE the window."""
    counts = np.zeros(num_codes, np.int64)
    seen, prev, head = 0, -1, 0
    for i in range(req.shape[0]):
        r = req[i]
        if not inside[r]:
            continue
        if chain[i] != prev:
            prev, seen, head = chain[i], 0, r
        seen += 1
        if seen == 2:
            counts[code[head]] += 1
    return counts


@njit(cache=True, nogil=True)
def _lifespans_by_category(req: np.ndarray, chain: np.ndarray, inside: np.ndarray, code: np.ndarray,
                           arrival_s: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """The lifespans of the chains _count_reused counts (ARRIVAL_S of the last access inside the window -
    of the first), grouped by category (category i at BOUNDS[i]:BOUNDS[i + 1]), in chain order in each."""
    out = np.empty(bounds[-1], np.float64)
    fill = bounds[:-1].copy()
    seen, prev, head, last = 0, -1, 0, 0
    for i in range(req.shape[0] + 1):
        if i < req.shape[0]:
            r = req[i]
            if not inside[r]:
                continue
            if chain[i] == prev:
                seen += 1
                last = r
                continue
        if seen >= 2:  # the chain before ends: a reused one
            c = code[head]
            out[fill[c]] = arrival_s[last] - arrival_s[head]
            fill[c] += 1
        if i < req.shape[0]:
            prev, seen, head, last = chain[i], 1, r, r
    return out


def _by_category(names: list[str], codes: np.ndarray, take: Callable[[np.ndarray], T]) -> dict[str, T]:
    """TAKE(indices of the items of category i) for every category i present in CODES."""
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    out: dict[str, T] = {}
    for i, name in enumerate(names):
        if bounds[i + 1] > bounds[i]:
            out[name] = take(order[bounds[i]:bounds[i + 1]])
    return out
