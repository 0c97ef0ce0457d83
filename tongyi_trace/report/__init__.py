"""The HTML report: Plotly figures and Jinja2 rendering from a run folder's saved artifacts only.

`render_report(run)` writes RUN_DIR/report.html; `screenshot(html, png)` photographs it in headless
Chromium (used by `make demo`).
"""

from tongyi_trace.report.browser import screenshot
from tongyi_trace.report.render import render_report

__all__ = ["render_report", "screenshot"]
