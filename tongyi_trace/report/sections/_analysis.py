"""Reading one characterization artifact (RUN_DIR/analysis/NAME.json + its Parquet tables) for a section.

Layout written by tongyi_trace/analysis/runner.py (docs/artifacts/analysis.md): NAME.json holds
schema, title, figure, definition, status ("ok" | "absent"), reason, headline, tables {key: file},
absent_parts {part: reason}.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from tongyi_trace.errors import InputError
from tongyi_trace.report.artifacts import read_parquet, read_versioned
from tongyi_trace.report.model import Section
from tongyi_trace.run import RunDir
from tongyi_trace.schemas import ANALYSIS_SCHEMA

REMEDY = "re-run 'kvtrace analyze RUN_DIR'"


@dataclass(frozen=True)
class Analysis:
    """One analysis artifact: its JSON document and access to its tables."""

    run: RunDir
    name: str
    doc: dict[str, Any]

    @property
    def headline(self) -> dict[str, Any]:
        """The analysis' headline figures."""
        h: dict[str, Any] = self.doc.get("headline") or {}
        return h

    @property
    def ok(self) -> bool:
        """True when the analysis ran (status "ok")."""
        return self.doc.get("status") == "ok"

    def has_table(self, key: str) -> bool:
        """True when the artifact lists table KEY."""
        return key in (self.doc.get("tables") or {})

    def table(self, key: str) -> pl.DataFrame:
        """Table KEY (an InputError when the artifact lists it but the file is gone or broken)."""
        files: dict[str, str] = self.doc.get("tables") or {}
        path = self.run.path / "analysis" / files.get(key, f"{self.name}_{key}.parquet")
        df = read_parquet(path, REMEDY) if key in files else None
        if df is None:
            raise InputError(f"{path}: table '{key}' of analysis '{self.name}' is missing; {REMEDY}")
        return df


def load(run: RunDir, name: str) -> Analysis | None:
    """The artifact of analysis NAME, or None when that analysis was not run."""
    doc = read_versioned(run.path / "analysis" / f"{name}.json", ANALYSIS_SCHEMA, REMEDY)
    return None if doc is None else Analysis(run, name, doc)


def section(a: Analysis, title: str | None = None) -> Section:
    """The section frame of analysis A: title, paper figure, definition, absent reason and parts."""
    return Section(
        key=a.name,
        title=title or str(a.doc.get("title") or a.name),
        paper_ref=str(a.doc.get("figure") or ""),
        definition=str(a.doc.get("definition") or ""),
        absent_reason=None if a.ok else str(a.doc.get("reason") or "the analysis could not run on this trace"),
        absent_parts={str(k): str(v) for k, v in (a.doc.get("absent_parts") or {}).items()},
    )


def analysis_builder(name: str, fill: Callable[[Analysis, Section], None]) -> Callable[[RunDir], list[Section]]:
    """The section builder of analysis NAME: nothing when it was not run, the frame alone with its reason
    when it is absent, else the frame that FILL completes (figures, tables, values, headline)."""

    def build(run: RunDir) -> list[Section]:
        a = load(run, name)
        if a is None:
            return []
        s = section(a)
        if a.ok:
            fill(a, s)
        return [s]

    build.__doc__ = f"The section of analysis {name!r} (nothing when it was not run)."
    return build
