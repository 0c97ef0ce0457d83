"""Render a run folder's saved artifacts into one self-contained, offline HTML file (RUN_DIR/report.html).

Plotly's JS is inlined once; each figure is a <div> drawn from one JSON payload embedded in a
<script type="application/json"> element; templates (reports/, Jinja2, autoescape on) lay out one
partial per section. Nothing here reads the raw trace or recomputes an analysis.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import plotly.offline
from markupsafe import Markup

from tongyi_trace import __version__
from tongyi_trace.errors import UsageError
from tongyi_trace.report.figures import figure_json, template_json
from tongyi_trace.report.model import Headline, Section
from tongyi_trace.report.sections import BUILDERS
from tongyi_trace.resources import reports_dir
from tongyi_trace.run import RunDir, atomic_write_text, check_not_run_table

REPORT_NAME = "report.html"
HEADLINE_ROWS = 6  # rows of the headline table shown; the rest behind "show all"

# Steps whose artifacts add sections, and the command that produces them (shown when not run).
STEPS: list[tuple[str, str]] = [
    ("analysis", "kvtrace analyze RUN_DIR"),
    ("fit", "kvtrace fit RUN_DIR -o policy.json"),
    ("sim", "kvtrace simulate RUN_DIR --policy lru,wa,oracle --capacity 1x"),
    ("replay", "kvtrace replay RUN_DIR --server URL"),
]


@dataclass(frozen=True)
class MissingStep:
    """A pipeline step whose artifacts are not in the run folder."""

    folder: str
    command: str


def render_report(run: RunDir, out: Path | None = None) -> Path:
    """Write the HTML report of RUN (to OUT, default RUN_DIR/report.html) and return its path; the run
    folder is held meanwhile, so no writer changes the artifacts under it."""
    with run.lock():
        return _render_report(run, out)


def _render_report(run: RunDir, out: Path | None) -> Path:
    sections = build_sections(run)
    html = render_html(run, sections)
    path = out if out is not None else run.path / REPORT_NAME
    if path.is_dir():
        raise UsageError(f"{path}: is a folder; give -o the path of the .html file to write")
    check_not_run_table(path, "-o")
    atomic_write_text(path, html)
    return path


def build_sections(run: RunDir) -> list[Section]:
    """Every section the run folder's artifacts support, in report order."""
    sections: list[Section] = []
    for build in BUILDERS:
        sections.extend(build(run))
    keys = [s.key for s in sections]
    if len(keys) != len(set(keys)):
        raise AssertionError(f"duplicate report section keys: {keys}")
    return sections


def render_html(run: RunDir, sections: list[Section]) -> str:
    """The report page for SECTIONS (figures embedded, Plotly inlined)."""
    figures = {fig_dom_id(s.key, name): figure_json(fig) for s in sections for name, fig in s.figures.items()}
    payload = "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in figures.items()) + "}"
    headline: list[tuple[Section, Headline]] = [(s, h) for s in sections for h in s.headline]
    missing = [MissingStep(folder, cmd) for folder, cmd in STEPS if not _has_artifacts(run.path / folder)]
    return _environment().get_template("base.html.j2").render(
        title=f"kvtrace report: {Path(str(run.provenance().get('source', run.path))).name}",
        run_path=str(run.path),
        sections=sections,
        headline=headline,
        missing=missing,
        version=__version__,
        generated_at=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        plotly_js=_plotly_js(),
        figures_json=Markup(payload),  # script-safe JSON (figures.figure_json)
        template_json=Markup(template_json()),
        num_figures=len(figures),
    )


def fig_dom_id(section_key: str, name: str) -> str:
    """DOM id of figure NAME of section SECTION_KEY (the templates' `figure` macro uses the same)."""
    return f"fig-{section_key}-{name}"


def _has_artifacts(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(reports_dir())),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=visible_controls,
    )
    env.globals["fig_dom_id"] = fig_dom_id
    env.globals["HEADLINE_ROWS"] = HEADLINE_ROWS
    return env


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def visible_controls(value: Any) -> Any:
    """VALUE with each control character of a string from the trace (a NUL in a type name) shown as \\xNN:
    autoescaping leaves them raw, and a NUL in a page is invalid HTML. The page's own markup is left as is."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", value)
    return value


@lru_cache(maxsize=1)
def _plotly_js() -> Markup:
    """plotly.js (bundled with plotly.py), inlined once per page; it must not close its <script>."""
    js = plotly.offline.get_plotlyjs()
    if "</script" in js.lower():
        raise AssertionError("bundled plotly.js contains '</script': cannot inline it")
    return Markup(js)
