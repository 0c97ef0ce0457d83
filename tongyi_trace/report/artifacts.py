"""Reading saved artifacts for the report: missing -> None (the section is left out), broken -> InputError."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from tongyi_trace.errors import InputError
from tongyi_trace.run import check_identity


def read_json(path: Path, remedy: str) -> dict[str, Any] | None:
    """The JSON object at PATH, None when PATH does not exist; REMEDY says which command rewrites it."""
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: unreadable artifact ({e}); {remedy}") from e
    if not isinstance(obj, dict):
        raise InputError(f"{path}: expected a JSON object, found {type(obj).__name__}; {remedy}")
    check_identity(path, obj)  # an artifact of another ingest of this folder is refused, never mixed in
    return obj


def read_versioned(path: Path, schema: str, remedy: str) -> dict[str, Any] | None:
    """`read_json`, and an InputError unless the document's field 'schema' is SCHEMA."""
    doc = read_json(path, remedy)
    if doc is not None and doc.get("schema") != schema:
        raise InputError(f"{path}: field 'schema' is {doc.get('schema')!r}, expected {schema!r}; {remedy}")
    return doc


def read_parquet(path: Path, remedy: str, columns: list[str] | None = None) -> pl.DataFrame | None:
    """The Parquet table at PATH (optionally only COLUMNS), None when PATH does not exist."""
    if not path.is_file():
        return None
    try:
        return pl.read_parquet(path, columns=columns)
    except (OSError, pl.exceptions.PolarsError) as e:
        raise InputError(f"{path}: unreadable artifact ({e}); {remedy}") from e


def require(obj: dict[str, Any], key: str, path: Path, remedy: str) -> Any:
    """OBJ[KEY], or an InputError naming PATH and the missing field."""
    try:
        return obj[key]
    except KeyError:
        raise InputError(f"{path}: field '{key}' missing; {remedy}") from None


def read_results(d: Path, required: list[str], optional: list[str], what: str, remedy: str) -> pl.DataFrame | None:
    """A sweep's results: D/results.parquet, or the rows D/results.jsonl holds so far (a sweep still running
    or interrupted; failed rows, which carry `error`, left out), with the REQUIRED columns and whichever
    OPTIONAL ones exist; None when there are none yet. WHAT names the sweep in errors."""
    df = read_parquet(d / "results.parquet", remedy)
    if df is None:
        path = d / "results.jsonl"
        if not path.is_file():
            return None
        keep = set(required) | set(optional)
        rows = []
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{path}:{i}: not a JSON result ({e.msg}); {remedy}") from e
                if "error" not in row:
                    rows.append({k: v for k, v in row.items() if k in keep})
        if not rows:
            return None
        df = pl.DataFrame(rows, infer_schema_length=None)
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise InputError(f"{d}: {what} results lack field(s) {', '.join(missing)}; {remedy}")
    return df.select(required + [c for c in optional if c in df.columns])
