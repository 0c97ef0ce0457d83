"""What a report section is made of: figures, tables, headline figures and the values its prose quotes.

Section builders (tongyi_trace/report/sections/) read saved artifacts of a run folder and return these;
the Jinja2 partial reports/sections/<key>.html.j2 lays them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tongyi_trace.report.figures import Fig


@dataclass(frozen=True)
class Headline:
    """One row of the report's headline table."""

    label: str
    value: str
    paper: str = ""  # the paper's figure for the same quantity, for comparison ("" when none)


@dataclass(frozen=True)
class Table:
    """A small table: column names and rows of already formatted cells."""

    columns: list[str]
    rows: list[list[str]]
    caption: str = ""


@dataclass
class Section:
    """One section of the report (one analysis, or provenance, fit, simulation...).

    `absent_reason` set means the section is shown only as a note saying why it has no content
    (e.g. "the trace has no request types"); `absent_parts` names parts left out, each with its reason.
    `values` holds figures the template's prose quotes.
    """

    key: str  # unique in the report: the anchor and the figures' DOM id prefix
    title: str
    paper_ref: str = ""
    absent_reason: str | None = None
    absent_parts: dict[str, str] = field(default_factory=dict)
    definition: str = ""
    figures: dict[str, Fig] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    headline: list[Headline] = field(default_factory=list)
    partial: str = ""  # the partial's name when several sections share one (default: key)

    @property
    def template(self) -> str:
        """Name of the Jinja2 partial that lays this section out."""
        return f"sections/{self.partial or self.key}.html.j2"
