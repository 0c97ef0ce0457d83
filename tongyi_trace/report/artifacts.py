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
