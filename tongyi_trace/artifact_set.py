"""Artifact sets committed as one step, and the clean-up of what an interrupted command left behind.

A command that replaces a set of artifacts (analyze: RUN/analysis/, simulate: RUN/sim/[NAME/], fit: RUN/fit/,
ingest: the run's tables) writes the whole new set into a staging folder first (`RUN/.staging.<random>/`).
Its commit is one atomic rename: a journal (`RUN/.kvtrace.commit.json`, naming each staging folder, its
target folder and the target's marker file) replaces nothing until it exists, and once it exists the set is
applied forward, by this command or, after a crash, by the next command that locks the run (`recover`):

  1. remove the target's marker (manifest.json in a set folder, provenance.json for the run's tables);
  2. move every staged file but the marker over the target's files;
  3. delete the target's files that are not in the new set (a sweep without WA leaves no guard tables);
  4. move the marker in last (a set folder's manifest.json lists the run identity, the command and the files);
  5. then delete the downstream results the journal names (an ingest --overwrite), the staging folders and
     the journal.

Killed before the journal exists, the previous set is untouched; killed after, the next command completes
the new set. Readers (run.check_identity, so read_artifact and the report) refuse a file of a set folder
without its manifest.json ("analysis incomplete: rerun kvtrace analyze RUN").

Test hook (documented for the crash-consistency tests in tests/hardening/test_crash.py):
KVTRACE_CRASH_AFTER_WRITES=N makes the process SIGKILL itself right after its N-th committed write
(atomic.commit_point: every atomic rename and every step of a journal's application); KVTRACE_WRITE_LOG=FILE
appends the path of each committed write to FILE (how the tests find the kill points).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tongyi_trace.atomic import atomic_write_text, commit_point, json_text
from tongyi_trace.errors import InputError
from tongyi_trace.schemas import SET_SCHEMA

MANIFEST_NAME = "manifest.json"
JOURNAL_NAME = ".kvtrace.commit.json"
STAGING_PREFIX = ".staging."
TRASH_PREFIX = ".trash."
SET_FOLDERS = ("analysis", "fit", "sim")  # RUN/NAME and RUN/sim/SWEEP (but sim/fleet) hold committed sets
UNCOMMITTED_SUBFOLDERS = frozenset({"fleet"})  # RUN/sim/fleet/ is written by `simulate --instances` alone
_TEMP_FILE = re.compile(r"^\..+\.\d+\.\d+\.[0-9a-f]{8}\.tmp(\.[^.]*)?$")  # atomic.temp_path's names
COMMANDS = {"analysis": "analyze", "fit": "fit", "sim": "simulate"}


def staging_dir(run_path: Path) -> Path:
    """A new, empty staging folder inside the run folder RUN_PATH (hidden; removed by the commit or by
    `recover` at the next command's start)."""
    d = run_path / f"{STAGING_PREFIX}{os.getpid()}.{secrets.token_hex(4)}"
    d.mkdir()
    return d


@contextmanager
def staged(run_path: Path, keep_from: Path | None = None) -> Iterator[Path]:
    """Yield a staging folder of RUN_PATH (prefilled with hard links to the files of KEEP_FROM, its manifest
    excepted, when KEEP_FROM holds a committed set: a command that adds to a set); it is removed when the block
    fails before its commit began."""
    d = staging_dir(run_path)
    try:
        if keep_from is not None and (keep_from / MANIFEST_NAME).is_file():  # only a committed set is kept
            for f in keep_from.iterdir():
                if f.is_file() and f.name != MANIFEST_NAME and not _TEMP_FILE.match(f.name):
                    _link_or_copy(f, d / f.name)
        yield d
    except BaseException:
        if not (run_path / JOURNAL_NAME).exists():  # else a commit began: `recover` completes it from D
            shutil.rmtree(d, ignore_errors=True)
        raise


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def copy_staged(run_path: Path, staging: Path) -> Path:
    """A second staging folder holding the files of STAGING (hard links): one set committed to two targets."""
    d = staging_dir(run_path)
    for f in staging.iterdir():
        if f.is_file():
            _link_or_copy(f, d / f.name)
    return d


def commit_sets(run_path: Path, sets: Sequence[tuple[Path, Path]], command: str, run_id: str | None,
                remove: Sequence[str] = (), files: Sequence[tuple[Path, Path, str]] = ()) -> None:
    """Commit each (STAGING, TARGET) folder pair of RUN_PATH as one step: a manifest.json (run identity,
    COMMAND, the files) written last into each, one journal, then the files moved in; REMOVE (names under
    RUN_PATH) deleted after. FILES: (STAGING, TARGET, NAME) single files moved in with the sets, each from its
    own staging folder into a folder whose other files stay (replay's RUN/replay/cost_model.json). Killed at
    any point, `recover` completes it or the old sets stay."""
    entries = []
    for staging, target in sets:
        names = sorted(f.name for f in staging.iterdir() if f.is_file() and f.name != MANIFEST_NAME)
        manifest = {"schema": SET_SCHEMA, "run_id": run_id, "command": command, "folder": _rel(run_path, target),
                    "files": names}
        atomic_write_text(staging / MANIFEST_NAME, json_text(manifest))
        entries.append({"staging": _rel(run_path, staging), "target": _rel(run_path, target),
                        "marker": MANIFEST_NAME, "prune": True})
    entries += [{"staging": _rel(run_path, staging), "target": _rel(run_path, target), "marker": name, "prune": False}
                for staging, target, name in files]
    _commit(run_path, entries, list(remove))


def commit_tables(run_path: Path, staging: Path, marker: str, remove: Sequence[str] = ()) -> None:
    """Commit the run's tables staged in STAGING into RUN_PATH itself, MARKER (provenance.json) last, then
    delete REMOVE (an overwrite's old results), as one step (see the module docstring)."""
    _commit(run_path, [{"staging": _rel(run_path, staging), "target": ".", "marker": marker, "prune": False}],
            list(remove))


def _rel(root: Path, p: Path) -> str:
    return os.path.relpath(p, root)


def _commit(run_path: Path, entries: list[dict[str, Any]], remove: list[str]) -> None:
    journal = {"schema": SET_SCHEMA, "sets": entries, "remove": remove}
    atomic_write_text(run_path / JOURNAL_NAME, json_text(journal))  # the commit point
    _apply(run_path, journal)


def _apply(root: Path, journal: dict[str, Any]) -> None:
    """Apply JOURNAL forward (idempotent: a step already done is skipped)."""
    for e in journal.get("sets", []):
        staging, target, marker = root / e["staging"], root / e["target"], e["marker"]
        if not staging.is_dir():
            continue  # applied before
        target.mkdir(parents=True, exist_ok=True)
        staged_marker = staging / marker
        if not staged_marker.is_file():  # the marker is in: only the staging folder was left
            shutil.rmtree(staging, ignore_errors=True)
            continue
        (target / marker).unlink(missing_ok=True)  # 1: the marker goes first ...
        for f in sorted(staging.iterdir()):  # 2 (what an interrupted application left)
            if f.is_file() and f.name != marker:
                os.replace(f, target / f.name)
                commit_point(target / f.name)
        if e.get("prune"):  # 3: the new set is the one its manifest lists, some of it moved in before a crash
            keep = set(json.loads(staged_marker.read_text())["files"]) | {marker}
            for f in target.iterdir():
                if f.is_file() and f.name not in keep:
                    f.unlink()
        if staged_marker.is_file():  # 4: ... and comes back last
            os.replace(staged_marker, target / marker)
            commit_point(target / marker)
        shutil.rmtree(staging, ignore_errors=True)
    for name in journal.get("remove", []):  # 5
        p = root / name
        if p.is_dir():
            trash = root / f"{TRASH_PREFIX}{secrets.token_hex(4)}"
            os.replace(p, trash)
            commit_point(p)
            shutil.rmtree(trash, ignore_errors=True)
        elif p.exists():
            p.unlink()
            commit_point(p)
    (root / JOURNAL_NAME).unlink(missing_ok=True)


def recover(run_path: Path) -> list[str]:
    """At a command's start (under the run lock): complete a commit a killed command left journaled, then
    remove staging and trash folders, temporary files of atomic writes and DuckDB spill folders. Returns
    what was removed or completed (names relative to RUN_PATH)."""
    done: list[str] = []
    journal_path = run_path / JOURNAL_NAME
    if journal_path.is_file() and not journal_path.is_symlink():
        try:
            journal = json.loads(journal_path.read_text())
        except (OSError, ValueError):
            journal = None  # cut short: the commit point was never reached (atomic writes make this rare)
        if isinstance(journal, dict) and journal.get("schema") == SET_SCHEMA:
            _apply(run_path, journal)
            done.append(JOURNAL_NAME)
        journal_path.unlink(missing_ok=True)
    for d in _scanned(run_path):
        try:
            children = list(d.iterdir())
        except OSError:
            continue
        for p in children:
            name = p.name
            if p.is_symlink():
                continue
            if d == run_path and p.is_dir() and (name.startswith(STAGING_PREFIX) or name.startswith(TRASH_PREFIX)):
                shutil.rmtree(p, ignore_errors=True)
            elif p.is_dir() and (name.startswith("duckdb-") or _TEMP_FILE.match(name)) and d != run_path / "sim":
                shutil.rmtree(p, ignore_errors=True)  # DuckDB spill folders (analysis/duckdb-*, ingest's .duckdb.*)
            elif p.is_file() and _TEMP_FILE.match(name):
                p.unlink(missing_ok=True)
            else:
                continue
            done.append(_rel(run_path, p))
    return done


def _scanned(run_path: Path) -> list[Path]:
    """The folders of a run that kvtrace writes into (never deeper: a foreign folder is left alone)."""
    out = [run_path]
    for name in (*SET_FOLDERS, "replay"):
        d = run_path / name
        if d.is_dir() and not d.is_symlink():
            out.append(d)
            out.extend(c for c in d.iterdir() if c.is_dir() and not c.is_symlink()
                       and not c.name.startswith("duckdb-") and not _TEMP_FILE.match(c.name))
    return out


def set_folder(root: Path, folder: Path) -> str | None:
    """The set FOLDER (inside the run ROOT) is, as the command that commits it ('analysis', 'sim', ...), or
    None when FOLDER holds no committed set."""
    try:
        parts = folder.resolve().relative_to(root.resolve()).parts
    except ValueError:
        return None
    if len(parts) == 1 and parts[0] in SET_FOLDERS:
        return parts[0]
    if len(parts) == 2 and parts[0] == "sim" and parts[1] not in UNCOMMITTED_SUBFOLDERS:
        return "sim"
    return None


def check_complete(root: Path, path: Path) -> None:
    """InputError when PATH lies in a set folder of the run ROOT that has no manifest.json (a command was
    stopped before it committed, or an older kvtrace wrote it), or is not in the set its manifest lists."""
    folder = path.parent
    kind = set_folder(root, folder)
    if kind is None or path.name == MANIFEST_NAME:
        return
    rerun = f"rerun kvtrace {COMMANDS[kind]} {root}"
    manifest = folder / MANIFEST_NAME
    if not manifest.is_file():
        raise InputError(f"{folder}: {kind} incomplete (no {MANIFEST_NAME}: the command that writes it was stopped "
                         f"or is older than this kvtrace); {rerun}")
    try:
        doc = json.loads(manifest.read_text())
        files = set(doc["files"])
    except (OSError, ValueError, KeyError, TypeError):
        raise InputError(f"{manifest}: unreadable manifest; {rerun}") from None
    if path.name not in files and path.exists():
        raise InputError(f"{path}: not in the set {manifest} lists (a leftover of an earlier command); {rerun}")
