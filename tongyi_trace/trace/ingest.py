"""`kvtrace ingest`: read a trace once, validate it, and write the normalized run folder.

Produces requests.parquet, blocks.parquet (with the prefix-chained identity chain_id and its dense
renumbering chain_idx) and provenance.json, as specified in docs/architecture.md. Raw block rows are
streamed chunk by chunk to a temporary Parquet file, and the final re-keying runs in DuckDB, which
spills to disk, so traces larger than memory can be ingested.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from tongyi_trace import __version__
from tongyi_trace.artifact_set import commit_tables, staged
from tongyi_trace.atomic import temp_path
from tongyi_trace.duckdb_setup import duckdb_connect
from tongyi_trace.errors import InputError, UsageError
from tongyi_trace.resources import read_query
from tongyi_trace.run import (
    BLOCKS_SCHEMA,
    DOWNSTREAM,
    REQUEST_COLUMNS,
    RUN_SCHEMA,
    RUN_TABLES,
    RunDir,
    is_run_dir,
    open_run,
    run_identity,
    run_lock,
    write_json,
)
from tongyi_trace.trace.categories import NO_CATEGORY, categories
from tongyi_trace.trace.chain import chain_ids
from tongyi_trace.trace.dense import ChainNumbers
from tongyi_trace.trace.formats import check_options, default_block_size, detect_format, linked_by
from tongyi_trace.trace.reader import read_chunks
from tongyi_trace.trace.records import Chunk, ReadStats
from tongyi_trace.trace.sessions import link_sessions
from tongyi_trace.trace.source import check_trace_path

# blocks.parquet's encoding: delta-packed integers (runs and counters shrink to a few bits), the chain ids
# (uniform 64-bit hashes, incompressible) stored plain: 3x faster to write and 2x faster to read than
# dictionary + zstd, and smaller.
_DELTA = "DELTA_BINARY_PACKED"
BLOCKS_WRITE_OPTIONS: dict[str, Any] = {
    "use_dictionary": False,
    "compression": {name: "none" if name == "chain_id" else "zstd" for name in BLOCKS_SCHEMA.names},
    "column_encoding": {name: "PLAIN" if name == "chain_id" else _DELTA for name in BLOCKS_SCHEMA.names},
}
ProgressFn = Callable[[int, int], None]  # (bytes of the trace file read, its size in bytes)


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, streamed."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _block_table(chunk: Chunk, raw0: int, block_size: int, numbers: ChainNumbers) -> pa.Table | None:
    """Block rows of one chunk (req_idx = index in file order; a chunk holds about reader.CHUNK_REFS, so its
    per-row columns stay small), None when it has no block."""
    offsets = chunk.offsets
    if int(offsets[-1]) == 0:
        return None
    chain = chain_ids(chunk.hash_ids, offsets)
    chain_idx = numbers.assign(chunk.hash_ids, offsets, chain)
    lengths = np.diff(offsets)
    pos = np.arange(int(offsets[-1]), dtype=np.int64)
    pos -= np.repeat(offsets[:-1], lengths)
    num_tokens = np.repeat(chunk.input_tokens, lengths)
    num_tokens -= pos * block_size
    np.clip(num_tokens, 0, block_size, out=num_tokens)
    raw_idx = np.repeat(np.arange(raw0, raw0 + len(chunk), dtype=np.int64), lengths)
    return pa.table({"req_idx": raw_idx, "pos": pos, "block_id": chunk.hash_ids, "chain_id": chain,
                     "chain_idx": chain_idx, "num_tokens": num_tokens}, schema=BLOCKS_SCHEMA)


def _hash_len_mismatches(chunk: Chunk, block_size: int) -> int:
    """Requests of CHUNK whose hash count disagrees with their input length."""
    expected = -(-chunk.input_tokens // block_size)
    return int(np.count_nonzero(expected != np.diff(chunk.offsets)))


def _sessions(path: Path, line_no: npt.NDArray[np.int64], chat_id: npt.NDArray[np.int64],
              parent: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Root chat id of each request's parent chain (pointer jumping; parents already resolved)."""
    order = np.argsort(chat_id, kind="stable")
    sorted_ids = chat_id[order]
    idx = np.arange(len(chat_id))
    has_parent = parent != -1
    up = idx.copy()
    up[has_parent] = order[np.searchsorted(sorted_ids, parent[has_parent])]
    for _ in range(64):  # pointer jumping: converges within log2(depth) steps
        nxt = up[up]
        if np.array_equal(nxt, up):
            break
        up = nxt
    looped = has_parent[up]  # a "root" that still has a parent: the links loop
    if looped.any():
        i = int(np.argmax(looped))
        raise InputError(f"{path}:{line_no[i]}: field 'parent_chat_id' {parent[i]} is part of a cycle of "
                         "parent links; every chain must end at a root (-1)")
    return chat_id[up]


KNOWN_RUN_FILES = (*RUN_TABLES, *DOWNSTREAM)
INGEST_LINKER = "kvtrace ingest"  # provenance sessions_linked_by of links inferred here (--infer-sessions)


def ingest_trace(trace: str | Path, out_dir: str | Path, *, fmt: str | None = None,
                 block_size: int | None = None, turn_buckets: list[int] | None = None,
                 on_error: str = "fail", progress: ProgressFn | None = None,
                 overwrite: bool = False, infer_sessions: bool | None = None,
                 duckdb_limit: str = "4GB") -> dict[str, Any]:
    """Read TRACE, validate and normalize it, write the run folder OUT_DIR; return the provenance.
    DUCKDB_LIMIT: DuckDB's memory limit when the blocks are re-keyed (budget.MemoryBudget.duckdb_limit).

    INFER_SESSIONS (default: for a Mooncake trace, which has no chat ids) links each request to the earlier
    one it continues (trace/sessions.py) and writes parent_chat_id, turn, session_id and the categories
    from those links instead of the trace's own; provenance "sessions" says "given", "inferred" or "none", and
    "sessions_linked_by" who inferred them: "kvtrace ingest", or "kvtrace capture" for a trace a capture wrote
    (its links are its session linker's, kept unless INFER_SESSIONS).

    OUT_DIR is held exclusively meanwhile. Re-ingesting other content (or other options) into a used run
    folder is refused unless OVERWRITE, which then deletes every downstream artifact of the old run. The
    tables are written under temporary names and renamed into place only once the whole trace is valid;
    a failed ingest leaves the folder as it was (and removes it if it created it)."""
    path = Path(trace)
    check_trace_path(path)
    if fmt is not None:
        check_options(fmt, on_error, block_size)
    fmt = fmt or detect_format(path)
    check_options(fmt, on_error, block_size)
    if block_size is None:
        block_size = default_block_size(path, fmt)
    buckets = list(turn_buckets or [1, 2, 3])
    if buckets != sorted(set(buckets)) or buckets[0] < 1:
        raise UsageError(f"turn buckets must be strictly ascending integers >= 1, got {buckets}")
    sha256 = file_sha256(path)
    infer = fmt == "mooncake" if infer_sessions is None else bool(infer_sessions)
    run_id = run_identity(sha256, fmt, block_size, buckets, on_error, infer)
    out = Path(out_dir)
    created = _prepare_out(out)
    try:
        with run_lock(out):
            return _ingest_locked(path, RunDir(out), fmt, block_size, buckets, on_error, (sha256, run_id),
                                  progress, overwrite, infer, duckdb_limit)
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise


def _prepare_out(out: Path) -> bool:
    """Create OUT if needed (True when created); one-line errors for a file or an unwritable place."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder; give -o a new or run folder path")
    if out.is_dir():
        if not os.access(out, os.W_OK):
            raise InputError(f"{out}: not writable (permission denied); choose another -o")
        _existing_run_id(RunDir(out))  # a folder of other files is refused before the lock leaves a file in it
        return False
    try:
        out.mkdir(parents=True)
    except OSError as e:
        raise InputError(f"{out}: cannot create the run folder ({e.strerror}); choose another -o") from None
    return True


def _ingest_locked(path: Path, run: RunDir, fmt: str, block_size: int, buckets: list[int], on_error: str,
                   identity: tuple[str, str], progress: ProgressFn | None, overwrite: bool,
                   infer: bool = False, duckdb_limit: str = "4GB") -> dict[str, Any]:
    run_id = identity[1]
    old_id = _existing_run_id(run)
    if old_id is not None and old_id != run_id and not overwrite:
        raise InputError(f"{run.path}: already holds the run of another trace or other ingest options "
                         f"(run_id {old_id or 'unknown'}); pass --overwrite to replace it and delete its "
                         "analysis/fit/sim/replay results, or choose another folder")
    size = path.stat().st_size
    stats = ReadStats(on_read=None if progress is None else (lambda num_bytes: progress(num_bytes, size)))
    findings: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    numbers = ChainNumbers()
    cols: dict[str, list[Any]] = {k: [] for k in ("line_no", "chat_id", "parent_chat_id", "timestamp_s",
                                                   "input_tokens", "output_tokens", "type", "turn",
                                                   "user_id", "num_blocks")}
    num_req = 0
    try:
        with staged(run.path) as stage:  # the new tables; the old run stays whole until the commit
            file_order_path = stage / "blocks_file_order.parquet"
            blocks_tmp, requests_tmp = stage / run.blocks_path.name, stage / run.requests_path.name
            with pq.ParquetWriter(file_order_path, BLOCKS_SCHEMA, **BLOCKS_WRITE_OPTIONS) as writer, \
                    ThreadPoolExecutor(1) as pool:  # Parquet encoding (no GIL) overlaps the parsing of the next chunk
                written: Future[None] | None = None
                for chunk in read_chunks(path, fmt, on_error, stats):
                    table = _block_table(chunk, num_req, block_size, numbers)
                    if table is not None:
                        if written is not None:
                            written.result()
                        written = pool.submit(writer.write_table, table)
                    findings["hash_len_mismatch"] += _hash_len_mismatches(chunk, block_size)
                    for k in ("line_no", "chat_id", "parent_chat_id", "timestamp_s", "input_tokens",
                              "output_tokens", "type", "turn", "user_id"):
                        cols[k].append(getattr(chunk, k))
                    cols["num_blocks"].append(np.diff(chunk.offsets))
                    num_req += len(chunk)
                if written is not None:
                    written.result()
            if progress is not None:  # the whole file, also when its last lines were all skipped
                progress(stats.num_bytes_read, size)
            if num_req == 0:
                raise InputError(f"{path}: no requests in the file (it is empty or every line was skipped); "
                                 "give a trace with at least one request")
            requests = _normalize_requests(path, fmt, cols, buckets, findings, examples, infer)
            if int(requests["num_blocks"].sum()) == 0:
                raise InputError(f"{path}: no request has a hash id (every hash_ids list is empty); a trace needs "
                                 "block ids to analyze")
            if not requests["raw_idx"].is_sorted():  # requests sorted by arrival: blocks follow
                _rekey_blocks(stage, file_order_path, blocks_tmp, requests, duckdb_limit)
                file_order_path.unlink()
            else:
                file_order_path.replace(blocks_tmp)  # file order is arrival order
            if infer:
                requests = _inferred_sessions(requests, blocks_tmp, block_size, buckets)
            requests.drop("line_no", "raw_idx").write_parquet(requests_tmp)
            linker = INGEST_LINKER if infer else linked_by(path) if fmt == "bailian" else None
            prov = _provenance(path, fmt, block_size, buckets, identity, stats, findings, examples, requests,
                               numbers.num_distinct,
                               "inferred" if linker else "none" if fmt == "mooncake" else "given", linker)
            write_json(stage / run.provenance_path.name, prov)
            # commit as one step: the tables, provenance.json last; another identity's results deleted only
            # after the new tables are in (artifact_set.py: a crash completes the commit or leaves the old run)
            commit_tables(run.path, stage, run.provenance_path.name, DOWNSTREAM if old_id != run_id else ())
    except OSError as e:
        raise InputError(f"{run.path}: cannot write the run folder ({e.strerror or e}); check free space "
                         "and permissions") from None
    return prov


def _existing_run_id(run: RunDir) -> str | None:
    """The identity of the run already in the folder ('' for one of an older kvtrace), None when empty;
    an InputError when the folder holds files kvtrace did not write."""
    unknown = sorted(p.name for p in run.path.iterdir()
                     if p.name not in KNOWN_RUN_FILES and not p.name.startswith("."))
    if unknown:
        raise InputError(f"{run.path}: holds files that are not a kvtrace run ({', '.join(unknown[:3])}); "
                         "give -o a new or empty folder")
    if not is_run_dir(run.path):
        return "" if any(not p.name.startswith(".") for p in run.path.iterdir()) else None
    try:
        prov = json.loads(run.provenance_path.read_text())
    except (OSError, ValueError):
        return ""
    rid = prov.get("run_id") if isinstance(prov, dict) else None
    return rid if isinstance(rid, str) else ""


def _provenance(path: Path, fmt: str, block_size: int, buckets: list[int], identity: tuple[str, str],
                stats: ReadStats,
                findings: Counter[str], examples: dict[str, list[str]], requests: pl.DataFrame,
                num_distinct: int, sessions: str, sessions_linked_by: str | None) -> dict[str, Any]:
    if stats.skipped:
        findings.update(stats.skipped)
        examples.update(stats.examples)
    if findings["hash_len_mismatch"]:
        examples.setdefault("hash_len_mismatch", [
            f"len(hash_ids) != ceil(input_length / {block_size}) for {findings['hash_len_mismatch']} requests"])
    ts = requests["arrival_s"].to_numpy()
    return {
        "schema": RUN_SCHEMA,
        "run_id": identity[1],
        "source": str(path.resolve()),
        "sha256": identity[0],
        "format": fmt,
        "block_size": block_size,
        "id_domain": stats.id_domain,
        "num_requests": requests.height,
        "num_block_refs": int(requests["num_blocks"].sum()),
        "num_distinct_blocks": num_distinct,
        "duration_s": float(ts.max() - ts.min()),
        "has_types": bool(requests["type"].is_not_null().any()),
        "has_turns": bool(requests["turn"].is_not_null().any()),
        "has_users": bool(requests["user_id"].is_not_null().any()),
        "has_sessions": bool((requests["session_id"] != requests["chat_id"]).any()),
        "sessions": sessions,
        "sessions_linked_by": sessions_linked_by,
        "turn_buckets": buckets,
        "findings": {k: int(v) for k, v in sorted(findings.items()) if v},
        "finding_examples": {k: v for k, v in sorted(examples.items()) if findings.get(k)},
        "created_by": f"kvtrace {__version__}",
    }


def _normalize_requests(path: Path, fmt: str, cols: dict[str, list[Any]], buckets: list[int],
                        findings: Counter[str], examples: dict[str, list[str]], infer: bool = False) -> pl.DataFrame:
    """The requests table in arrival order (req_idx), with sessions and categories resolved (INFER: the
    trace's own parent links are neither checked nor used)."""
    flat = {k: (np.concatenate(v) if k not in ("type", "turn", "user_id") else [x for c in v for x in c])
            for k, v in cols.items()}
    df = pl.DataFrame({
        "line_no": flat["line_no"], "chat_id": flat["chat_id"], "parent_chat_id": flat["parent_chat_id"],
        "user_id": pl.Series(flat["user_id"], dtype=pl.Utf8),
        "arrival_s": flat["timestamp_s"], "input_tokens": flat["input_tokens"],
        "output_tokens": flat["output_tokens"], "type": pl.Series(flat["type"], dtype=pl.Utf8),
        "turn": pl.Series(flat["turn"], dtype=pl.Int64), "num_blocks": flat["num_blocks"],
    }).with_row_index("raw_idx")
    ts = df["arrival_s"].to_numpy()
    out_of_order = int(np.count_nonzero(ts[1:] < ts[:-1]))
    if out_of_order and fmt != "aiperf":  # an AIPerf trace lists sessions, not arrivals: no finding
        findings["timestamps_out_of_order"] = out_of_order
        i = int(np.argmax(ts[1:] < ts[:-1])) + 1
        examples["timestamps_out_of_order"] = [f"{path}:{df['line_no'][i]}: timestamp {ts[i]} before "
                                               f"{ts[i - 1]}; requests stably sorted by timestamp"]
    if out_of_order:
        df = df.sort("arrival_s", maintain_order=True)
    df = df.with_row_index("req_idx").with_columns(pl.col("req_idx").cast(pl.Int64),
                                                   pl.col("raw_idx").cast(pl.Int64))
    if fmt == "mooncake":
        df = df.with_columns(chat_id=pl.col("req_idx"), session_id=pl.col("req_idx"),
                             category=pl.lit(NO_CATEGORY))
    else:
        dup = df.filter(pl.col("chat_id").is_duplicated()).sort("line_no")
        if dup.height:
            raise InputError(f"{path}:{dup['line_no'][1]}: field 'chat_id' {dup['chat_id'][1]} appears "
                             f"twice (also line {dup['line_no'][0]}); chat ids must be unique")
        if infer:  # the trace's own links give way to inferred ones (_inferred_sessions): nothing to check
            sessions = df["chat_id"].to_numpy()
        else:
            known = df["parent_chat_id"].is_in(df["chat_id"].implode()) | (df["parent_chat_id"] == -1)
            orphans = df.filter(~known)
            if orphans.height:
                findings["orphan_parent"] = orphans.height
                first = orphans.select("line_no", "parent_chat_id").head(5).iter_rows()
                examples["orphan_parent"] = [f"{path}:{ln}: parent_chat_id {p} never appears; treated as a root"
                                             for ln, p in first]
                df = df.with_columns(parent_chat_id=pl.when(known).then(pl.col("parent_chat_id")).otherwise(-1))
            sessions = _sessions(path, df["line_no"].to_numpy(), df["chat_id"].to_numpy(),
                                 df["parent_chat_id"].to_numpy())  # a cycle of links is an error
            if _check_parent_links(path, df, findings, examples):
                df = df.with_columns(parent_chat_id=pl.Series(_late_parents_cut(df), dtype=pl.Int64))
                sessions = _sessions(path, df["line_no"].to_numpy(), df["chat_id"].to_numpy(),
                                     df["parent_chat_id"].to_numpy())
        untyped = df["type"].null_count() == df.height and df["turn"].null_count() == df.height
        df = df.with_columns(session_id=pl.Series(sessions, dtype=pl.Int64),
                             category=pl.lit(NO_CATEGORY) if untyped else categories(df["type"], df["turn"], buckets))
    return df.select("raw_idx", "line_no", *REQUEST_COLUMNS)


def _parent_rows(df: pl.DataFrame) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The rows of DF that have a parent, and each one's parent row (every parent known)."""
    chat, parent = df["chat_id"].to_numpy(), df["parent_chat_id"].to_numpy()
    linked = np.flatnonzero(parent != -1)
    order = np.argsort(chat, kind="stable")
    return linked, order[np.searchsorted(chat[order], parent[linked])]


def _late_parents_cut(df: pl.DataFrame) -> npt.NDArray[np.int64]:
    """DF's parent_chat_id with -1 where the parent arrives after the request."""
    arrival, parent = df["arrival_s"].to_numpy(), df["parent_chat_id"].to_numpy().copy()
    linked, up = _parent_rows(df)
    parent[linked[arrival[up] > arrival[linked]]] = -1
    return parent


def _check_parent_links(path: Path, df: pl.DataFrame, findings: Counter[str],
                        examples: dict[str, list[str]]) -> bool:
    """Count, with examples, the requests of DF (every parent known) whose parent arrives after them
    (finding parent_after_child: True, they are to be made roots, their gap would be negative) and those
    whose turn is not their parent's turn + 1 (finding turn_parent_mismatch: the turns are kept)."""
    chat, parent = df["chat_id"].to_numpy(), df["parent_chat_id"].to_numpy()
    arrival, line = df["arrival_s"].to_numpy(), df["line_no"].to_numpy()
    linked, up = _parent_rows(df)
    late = arrival[up] > arrival[linked]
    if late.any():
        findings["parent_after_child"] = int(late.sum())
        examples["parent_after_child"] = [
            f"{path}:{line[i]}: chat_id {chat[i]} at {arrival[i]:g} s has parent_chat_id {parent[i]}, which "
            f"arrives later ({arrival[j]:g} s, line {line[j]}); treated as a root"
            for i, j in zip(linked[late][:5], up[late][:5], strict=True)]
    if df["turn"].null_count() == 0 and len(linked):
        turn = df["turn"].to_numpy()
        kept, kept_up = linked[~late], up[~late]
        bad = turn[kept] != turn[kept_up] + 1
        if bad.any():
            findings["turn_parent_mismatch"] = int(bad.sum())
            examples["turn_parent_mismatch"] = [
                f"{path}:{line[i]}: turn {turn[i]} of chat_id {chat[i]} is not its parent's turn {turn[j]} + 1 "
                f"(line {line[j]}); the turn is kept as given"
                for i, j in zip(kept[bad][:5], kept_up[bad][:5], strict=True)]
    return bool(late.any())


def _inferred_sessions(requests: pl.DataFrame, blocks_path: Path, block_size: int,
                       buckets: list[int]) -> pl.DataFrame:
    """REQUESTS (arrival order) with parent_chat_id, turn, session_id and category from the prefix links of
    trace/sessions.py over the chained ids of BLOCKS_PATH (arrival order)."""
    chain = pq.read_table(blocks_path, columns=["chain_id"]).column("chain_id").to_numpy()
    offsets = np.zeros(requests.height + 1, dtype=np.int64)
    np.cumsum(requests["num_blocks"].to_numpy(), out=offsets[1:])
    links = link_sessions(chain, offsets, requests["input_tokens"].to_numpy(), block_size)
    chat = requests["chat_id"].to_numpy()
    turn = pl.Series("turn", links.turn, dtype=pl.Int64)
    return requests.with_columns(
        parent_chat_id=pl.Series(np.where(links.parent >= 0, chat[np.maximum(links.parent, 0)], -1)),
        turn=turn, session_id=pl.Series(chat[links.session]),
        category=categories(requests["type"], turn, buckets))


def _rekey_blocks(stage: Path, file_order_path: Path, out: Path, requests: pl.DataFrame,
                  duckdb_limit: str) -> None:
    """Write blocks to OUT in arrival order (DuckDB under DUCKDB_LIMIT, spills to disk in STAGE) when the file
    was not sorted by time."""
    spill = temp_path(stage / "duckdb")
    con = duckdb_connect(spill, duckdb_limit)
    try:
        con.read_parquet(str(file_order_path)).create_view("file_blocks")
        con.register("req_order", requests.select("raw_idx", "req_idx").to_arrow())
        batches = con.sql(read_query("ingest_blocks")).to_arrow_reader(1 << 20)  # streamed: DuckDB spills
        with pq.ParquetWriter(out, BLOCKS_SCHEMA, **BLOCKS_WRITE_OPTIONS) as writer:
            for batch in batches:
                writer.write_batch(batch)
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)


def default_run_dir(trace: Path) -> Path:
    """`<trace name>.kvtrace` in the current directory (the trace's folder may be read-only), the name
    without its compression and trace suffixes only: conv.v2.jsonl.zst -> conv.v2.kvtrace."""
    name = trace.name
    for suffix in (".gz", ".zst", ".jsonl", ".json", ".parquet"):
        name = name.removesuffix(suffix)
    return Path((name or trace.name) + ".kvtrace")


def ensure_run(trace_or_run: str | Path, out_dir: str | Path | None = None, **ingest_options: Any) -> RunDir:
    """A run folder for TRACE_OR_RUN: opened as is when it is one, else the trace is ingested into OUT_DIR
    (default: default_run_dir); a folder holding another trace's run is refused, never mixed."""
    p = Path(trace_or_run)
    if p.is_dir():
        return open_run(p)  # a folder that is not a run raises the "not a run folder" error
    target = Path(out_dir) if out_dir is not None else default_run_dir(p)
    check_trace_path(p)
    if is_run_dir(target):
        prov = open_run(target).provenance()
        if prov.get("sha256") == file_sha256(p):
            return RunDir(target)
    try:
        ingest_trace(p, target, **ingest_options)
    except InputError as e:
        if "already holds the run of another trace" not in str(e):
            raise
        raise InputError(f"{target}: already holds the run of another trace; pass -o with another folder, or "
                         f"replace it with 'kvtrace ingest {p} -o {target} --overwrite'") from None
    return RunDir(target)


def summarize(prov: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of an ingest (what --json prints)."""
    keys = ("format", "block_size", "num_requests", "num_block_refs", "num_distinct_blocks", "duration_s",
            "sessions")
    out = {k: prov[k] for k in keys}
    out["findings"] = prov["findings"]
    return out
