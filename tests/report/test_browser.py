"""The report in a real headless Chromium (Debian's, via Playwright): it loads offline with no console
error, every figure has drawn data, hostile trace strings show as text and run nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tongyi_trace.report import render_report, screenshot
from tongyi_trace.report.browser import find_chromium, open_page, wait_until_drawn
from tongyi_trace.run import RunDir

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(find_chromium() is None,
                       reason="chromium is not installed: run 'make browser' (Debian chromium, chromium-driver)"),
]

EVIL = "<script>alert(1)</script>"  # the fixture's hostile type and user id (conftest.py)
EVIL_USER = "</script><img src=x onerror=alert(2)>"

# Per figure: per trace its type and how many finite values it drew (from plotly's calcdata: points of
# a line or bar, cells of a heatmap), plus how many marks (lines, points, bars, heatmap images) it holds.
_FIGURES_JS = """() => {
  const finite = v => typeof v === 'number' && isFinite(v);
  const cells = z => Array.from(z || []).reduce((n, row) => n + Array.from(row).filter(finite).length, 0);
  return Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => ({
    id: gd.id,
    traces: (gd.calcdata || []).map((cd, i) => ({
      type: gd._fullData[i].type,
      visible: gd._fullData[i].visible,
      points: gd._fullData[i].type === 'heatmap' ? cells(cd[0].z)
                                                 : cd.filter(p => finite(p.x) && finite(p.y)).length,
    })),
    marks: gd.querySelectorAll('path.js-line, .point, .hm image').length,
  }));
}"""


# The first section of the page: its id, the next one's, its sentences and its per-capacity table by column.
_FIRST_SECTION_JS = """() => {
  const s = document.querySelector('main > section');
  const table = s.querySelectorAll('table')[0];
  const columns = Array.from(table.querySelectorAll('thead th')).map(th => th.textContent.trim());
  const rows = Array.from(table.querySelectorAll('tbody tr')).map(
    tr => Array.from(tr.querySelectorAll('td')).map(td => td.textContent.trim()));
  return {id: s.id, next: s.nextElementSibling.id, columns: columns,
          table: columns.map((_, i) => rows.map(r => r[i])),
          lines: Array.from(s.querySelectorAll('ul.kv-recommendation li')).map(li => li.textContent.trim())};
}"""


def test_report_loads_offline_and_draws_every_figure(evil_run: RunDir) -> None:
    html = render_report(evil_run)
    errors: list[str] = []
    dialogs: list[str] = []
    refused: list[str] = []
    with open_page(html) as page:
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.on("requestfailed", lambda r: refused.append(r.url))
        page.reload(wait_until="load")  # listeners are attached: load again so nothing is missed
        wait_until_drawn(page)
        figures: list[dict[str, Any]] = page.evaluate(_FIGURES_JS)
        expected = page.evaluate("() => window.kvReport.numFigures")
        body_text = page.inner_text("body")
        svg_text = page.evaluate("() => Array.from(document.querySelectorAll('.js-plotly-plot text'))"
                                 ".map(t => t.textContent)")
        injected = page.evaluate("() => document.querySelectorAll('img, .js-plotly-plot script').length")
        first: dict[str, Any] = page.evaluate(_FIRST_SECTION_JS)
    assert errors == []
    assert dialogs == []  # the hostile type never ran
    assert refused == []  # nothing outside the file was requested: the page is self-contained
    assert len(figures) == expected
    for fig in figures:
        assert fig["traces"], f"{fig['id']}: no traces"
        drawn = [t for t in fig["traces"] if t["visible"] is True]
        assert drawn and all(t["points"] > 0 for t in drawn), f"{fig['id']}: a trace without points {fig}"
        assert fig["marks"] > 0, f"{fig['id']}: nothing drawn on the plot"
    assert EVIL in body_text  # the hostile string is shown, literally, as text
    assert EVIL in svg_text and EVIL_USER in svg_text  # also as axis labels inside the figures
    assert injected == 0
    # the answer leads: the first section is the Recommendation, in words, every gain with its interval
    assert first["id"] == "recommendation" and first["next"] == "headline"
    answers = [line for line in first["lines"] if line.startswith("At ")]
    assert len(answers) == 4 and all(" +- " in line and " points" in line for line in answers)
    assert all(" run " in line for line in answers)
    gains = first["table"][first["columns"].index("vs LRU (points)")]
    runs = first["table"][first["columns"].index("run")]
    assert len(gains) == 4 and all(" +- " in cell or run == "lru" for cell, run in zip(gains, runs, strict=True))


def test_screenshot_is_a_png_of_the_drawn_page(evil_run: RunDir, tmp_path: Path) -> None:
    png = screenshot(render_report(evil_run), tmp_path / "report.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(data[16:20], "big")
    height = int.from_bytes(data[20:24], "big")
    assert width == 1280 and height > 900  # full page, taller than one viewport
