"""Locate the SQL queries and HTML templates shipped with the package (installed or editable)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _shipped(installed_name: str, source_name: str) -> Path:
    packaged = Path(str(files("tongyi_trace"))) / installed_name
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / source_name


def queries_dir() -> Path:
    """Folder of the analysis SQL files (queries/ in the source tree, tongyi_trace/_queries in a wheel)."""
    return _shipped("_queries", "queries")


def reports_dir() -> Path:
    """Folder of the Jinja2 HTML report templates."""
    return _shipped("_reports", "reports")


def read_query(name: str) -> str:
    """Text of queries/NAME.sql."""
    return (queries_dir() / f"{name}.sql").read_text()
