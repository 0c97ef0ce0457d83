"""The run folder: where the normalized tables and every later artifact of one trace live."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from tongyi_trace.artifact_set import check_complete, recover
from tongyi_trace.atomic import atomic_path, atomic_write_text, json_text
from tongyi_trace.errors import InputError, UsageError
from tongyi_trace.schemas import RUN_SCHEMA

# The run folder's two tables (ingest writes them; every later step reads them): blocks.parquet's schema
# and requests.parquet's columns, checked when a run is opened.
BLOCKS_SCHEMA = pa.schema([("req_idx", pa.int64()), ("pos", pa.int64()), ("block_id", pa.int64()),
                           ("chain_id", pa.int64()), ("chain_idx", pa.int64()), ("num_tokens", pa.int64())])
REQUEST_COLUMNS = ("req_idx", "chat_id", "parent_chat_id", "session_id", "user_id", "arrival_s", "input_tokens",
                   "output_tokens", "type", "turn", "category", "num_blocks")
RUN_TABLES = ("provenance.json", "requests.parquet", "blocks.parquet")  # what makes a folder a run


class _TableReader:
    """Reads the two tables at REQUESTS_PATH and BLOCKS_PATH (RunDir and RunTables)."""

    if TYPE_CHECKING:  # a field of RunTables, a property of RunDir
        @property
        def requests_path(self) -> Path: ...

        @property
        def blocks_path(self) -> Path: ...

    def requests(self) -> pl.DataFrame:
        """The normalized requests table."""
        return pl.read_parquet(self.requests_path)

    def blocks(self, columns: list[str] | None = None) -> pl.DataFrame:
        """The normalized blocks table (optionally only some columns)."""
        return pl.read_parquet(self.blocks_path, columns=columns)


@dataclass(frozen=True)
class RunTables(_TableReader):
    """What the engine room (sim/, fit/, analysis/) reads of a run: the paths of its two tables and its
    provenance record; no artifact, no lock, no folder (`RunDir.tables()` makes one: the command layer and
    the drivers open the run folder and pass this down)."""

    requests_path: Path
    blocks_path: Path
    provenance_path: Path  # named in messages about the provenance fields
    provenance: dict[str, Any]


@dataclass(frozen=True)
class RunDir(_TableReader):
    """Paths of one run folder's artifacts."""

    path: Path

    @property
    def provenance_path(self) -> Path:
        return self.path / "provenance.json"

    @property
    def requests_path(self) -> Path:
        return self.path / "requests.parquet"

    @property
    def blocks_path(self) -> Path:
        return self.path / "blocks.parquet"

    def subdir(self, name: str) -> Path:
        """RUN_DIR/name, created on first use (analysis, fit, sim, replay...)."""
        d = self.path / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def provenance(self) -> dict[str, Any]:
        """The provenance record written by ingest."""
        return load_provenance(self)

    def tables(self) -> RunTables:
        """The run's tables and provenance, as the engine room takes them."""
        return RunTables(self.requests_path, self.blocks_path, self.provenance_path, self.provenance())

    def write_artifact(self, path: Path, obj: dict[str, Any]) -> None:
        """Write a JSON artifact of this run atomically, stamped with the run identity (OBJ too)."""
        rid = _run_id_at(self.path)
        if rid is not None:
            obj["run_id"] = rid
        write_json(path, obj)

    def read_artifact(self, path: Path, schema: str | None = None,
                      required: bool = True) -> dict[str, Any] | None:
        """Read a JSON artifact of this run (refused when another ingest made it); see read_artifact."""
        return read_artifact(path, schema, required)

    def lock(self) -> Any:
        """Context manager: hold this run folder exclusively (see run_lock)."""
        return run_lock(self.path)


def is_run_dir(path: Path) -> bool:
    """True when PATH holds the normalized tables of an ingested trace."""
    return path.is_dir() and (path / "provenance.json").is_file() and (path / "blocks.parquet").is_file()


def open_run(path: str | Path) -> RunDir:
    """Open an existing run folder, or raise InputError saying how to make one."""
    p = Path(path)
    if p.is_file():
        raise InputError(f"{p}: is a file, not a kvtrace run folder; make one with 'kvtrace ingest {p} -o "
                         "RUN_DIR' and pass RUN_DIR")
    if not is_run_dir(p):
        if (p / "study.json").is_file():
            raise InputError(f"{p}: is a study folder, not a run folder (its report is {p / 'index.html'}); give "
                             f"one of its runs, {p / 'runs'}/NAME")
        raise InputError(f"{p}: not a kvtrace run folder (no provenance.json/blocks.parquet); "
                         f"run 'kvtrace ingest TRACE -o {p}' first")
    run = RunDir(p)
    load_provenance(run)
    _check_tables(run)
    return run


def _check_tables(run: RunDir) -> None:
    """One-line InputError when a table of RUN is missing, unreadable or lacks a column (from the files'
    footers: no data is read)."""
    for path, names in ((run.blocks_path, BLOCKS_SCHEMA.names), (run.requests_path, REQUEST_COLUMNS)):
        try:
            have = set(pq.read_schema(path).names)
        except (OSError, pa.ArrowException) as e:
            raise InputError(f"{path}: not a readable Parquet table ({str(e).splitlines()[0]}); re-run "
                             "'kvtrace ingest' into this folder") from None
        missing = [n for n in names if n not in have]
        if missing:
            raise InputError(f"{path}: not a kvtrace {path.stem} table (no column{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(missing)}); it was overwritten or made by another tool: re-run "
                             "'kvtrace ingest' into this folder")


def check_not_run_table(out: Path, option: str) -> None:
    """UsageError when OUT (a file a command is about to write) is one of a run folder's own tables."""
    if out.name in RUN_TABLES and (out.parent / "provenance.json").is_file():
        raise UsageError(f"{option} {out}: is the run folder's own {out.name}; writing it would destroy the run. "
                         "Choose another file name or folder")


def load_provenance(run: RunDir) -> dict[str, Any]:
    """Read and check provenance.json."""
    try:
        prov: dict[str, Any] = json.loads(run.provenance_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{run.provenance_path}: unreadable ({e}); re-run 'kvtrace ingest'") from e
    if prov.get("schema") != RUN_SCHEMA:
        raise InputError(f"{run.provenance_path}: field 'schema' is {prov.get('schema')!r}, expected "
                         f"{RUN_SCHEMA!r}; re-run 'kvtrace ingest' with this kvtrace version")
    return prov


def run_identity(sha256: str, fmt: str, block_size: int, turn_buckets: list[int], on_error: str,
                 infer_sessions: bool = False) -> str:
    """The run's identity: a hash of the trace's content and of every ingest option that shapes the tables."""
    key = f"{sha256}|{fmt}|{block_size}|{','.join(map(str, turn_buckets))}|{on_error}"
    if infer_sessions:  # only then: the identity of every run without inferred sessions stays as it was
        key += "|inferred-sessions"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def run_root(path: Path) -> Path | None:
    """The run folder PATH lies in (PATH itself or an ancestor holding provenance.json), or None."""
    p = path.resolve()
    for d in [p, *p.parents][:5]:
        if (d / "provenance.json").is_file():
            return d
    return None


def _run_id_at(root: Path) -> str | None:
    try:
        prov = json.loads((root / "provenance.json").read_text())
    except (OSError, ValueError):
        return None
    rid = prov.get("run_id") if isinstance(prov, dict) else None
    return rid if isinstance(rid, str) else None


def check_identity(path: Path, doc: dict[str, Any]) -> None:
    """Raise InputError when DOC (read from PATH inside a run folder) was made from another ingest, or lies in
    an artifact set that was never committed (artifact_set.check_complete)."""
    root = run_root(path.parent)
    if root is not None:
        check_complete(root, path)
    expected = _run_id_at(root) if root is not None else None
    if expected is None or path.name == "provenance.json":
        return  # not inside a run folder, or a run ingested before identities existed
    found = doc.get("run_id")
    if found != expected:
        what = f"was made from another ingest (run_id {found})" if found else "carries no run_id (older kvtrace)"
        raise InputError(f"{path}: {what}, the run folder is run_id {expected}; re-run the command that "
                         "writes it, or re-ingest with --overwrite to clear stale results")


@overload
def read_artifact(path: Path, schema: str | None = None, required: Literal[True] = True) -> dict[str, Any]: ...


@overload
def read_artifact(path: Path, schema: str | None = None, required: bool = True) -> dict[str, Any] | None: ...


def read_artifact(path: Path, schema: str | None = None, required: bool = True) -> dict[str, Any] | None:
    """A JSON artifact of this run: a one-line InputError when unreadable, of another SCHEMA or of another
    run identity; None when absent and not REQUIRED."""
    if not path.is_file():
        if required:
            raise InputError(f"{path}: no such file; run the command that writes it first")
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: unreadable artifact ({' '.join(str(e).split())[:120]}); re-run the command "
                         "that writes it") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a JSON object, found {type(doc).__name__}; re-run the command "
                         "that writes it")
    if schema is not None and doc.get("schema") != schema:
        raise InputError(f"{path}: field 'schema' is {doc.get('schema')!r}, expected {schema!r}")
    check_identity(path, doc)
    return doc


def write_parquet_atomic(table: pl.DataFrame | pa.Table, path: Path) -> None:
    """Write a polars or Arrow table to PATH atomically."""
    with atomic_path(path) as tmp:
        if isinstance(table, pl.DataFrame):
            table.write_parquet(tmp)
        else:
            pq.write_table(table, tmp)


def write_json(path: Path, obj: Any) -> None:
    """Write OBJ as indented JSON atomically; a dict written inside a run folder is stamped with the run's
    identity (field run_id) so that readers can refuse stale artifacts (check_identity)."""
    if isinstance(obj, dict) and path.name != "provenance.json":
        root = run_root(path.parent)
        rid = _run_id_at(root) if root is not None else None
        if rid is not None:
            obj = {**obj, "run_id": rid}
    atomic_write_text(path, json_text(obj))


PIN_FILE = "pinned_sweep.json"  # RUN/pinned_sweep.json: the sweep the report reads (sim/recommend.py)
SIZING_FILE = "sizing.json"  # RUN/sizing.json: the model and GPU settings the run was last sized with (models.py)
DOWNSTREAM = ("analysis", "fit", "sim", "replay", "report.html", PIN_FILE, SIZING_FILE)
LOCK_NAME = ".kvtrace.lock"
_held: dict[Path, tuple[int, int]] = {}  # run folder -> (fd, depth): the lock is re-entrant in a process


@contextmanager
def run_lock(path: Path) -> Iterator[None]:
    """Hold the run folder PATH exclusively (writers: ingest, analyze, fit, simulate, replay, report);
    a second writer gets a one-line InputError naming the pid that holds it. Released on exit or death."""
    key = path.resolve()
    if key in _held:
        fd, depth = _held[key]
        _held[key] = (fd, depth + 1)
        try:
            yield
        finally:
            _held[key] = (fd, _held[key][1] - 1)
        return
    try:  # never through a symlink: a planted RUN/.kvtrace.lock -> FILE must not truncate FILE
        fd = os.open(key / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError(f"{path}/{LOCK_NAME} is a symbolic link, not kvtrace's lock file: remove it and "
                             "run again") from None
        raise InputError(f"{path}: cannot lock the run folder ({e.strerror}); check the path and "
                         "permissions") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{path}/{LOCK_NAME} is not a regular file: remove it and run again")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise InputError(f"{path}: in use by pid {holder} (another kvtrace command writes it); wait for it "
                         "to finish or use another folder") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = (fd, 1)
    try:
        recover(key)  # what a killed command left: a journaled commit completed, temp files removed
        yield
    finally:
        depth = _held[key][1] - 1
        if depth:
            _held[key] = (fd, depth)
        else:
            del _held[key]
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
