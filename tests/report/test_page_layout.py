"""The report's layout in a real headless Chromium, on a demo-like run (a to-C trace through ingest, analyze,
fit, simulate as `make demo` runs them, two replays and their comparison): the page stays under about
15,000 px, and every chart's data uses at least 10% of each numeric axis's range (differences visible)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tongyi_trace.analysis import run_analyses
from tongyi_trace.fit.policy_fit import fit_policy
from tongyi_trace.replay.compare import compare_replays
from tongyi_trace.replay.runner import ReplayOptions, run_replay
from tongyi_trace.replay.schedule import ScheduleOptions
from tongyi_trace.replay.standin import StandInState, serve
from tongyi_trace.report import render_report
from tongyi_trace.report.browser import find_chromium, open_page, wait_until_drawn
from tongyi_trace.run import open_run
from tongyi_trace.sim.sweep import SimulateOptions, simulate_run
from tongyi_trace.trace.ingest import ingest_trace
from tongyi_trace.trace.synth import synth_to_file

pytestmark = [
    pytest.mark.browser, pytest.mark.slow,
    pytest.mark.skipif(find_chromium() is None,
                       reason="chromium is not installed: run 'make browser' (Debian chromium, chromium-driver)"),
]

MAX_PAGE_HEIGHT_PX = 15_000
MIN_AXIS_SHARE = 0.10

# Per figure and numeric axis: how much of the axis's range the data of its line, marker and bar traces spans
# (in log10 on a log axis); axes whose data has fewer than two distinct values are left out.
RANGES_JS = """() => {
  const out = [];
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const spans = {};
    gd._fullData.forEach(t => {
      if (t.visible !== true || !['scatter', 'scattergl', 'bar'].includes(t.type)) { return; }
      for (const [letter, ref] of [['x', t.xaxis], ['y', t.yaxis]]) {
        const name = letter + 'axis' + (ref.length > 1 ? ref.slice(1) : '');
        const ax = gd._fullLayout[name];
        if (!ax || !['linear', 'log'].includes(ax.type)) { continue; }
        const vals = Array.from(t[letter] || []).filter(v => typeof v === 'number' && isFinite(v))
          .filter(v => ax.type !== 'log' || v > 0).map(v => ax.type === 'log' ? Math.log10(v) : v);
        if (!vals.length) { continue; }
        const s = spans[name] || (spans[name] = {lo: Infinity, hi: -Infinity, range: ax.range, type: ax.type});
        s.lo = Math.min(s.lo, ...vals); s.hi = Math.max(s.hi, ...vals);
      }
    });
    for (const [name, s] of Object.entries(spans)) {
      const width = Math.abs(s.range[1] - s.range[0]);
      out.push({id: gd.id, axis: name, type: s.type, lo: s.lo, hi: s.hi, range: s.range,
                share: s.hi > s.lo && width > 0 ? (s.hi - s.lo) / width : null});
    }
  }
  return out;
}"""


@pytest.fixture(scope="module")
def demo_like_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A to-C trace (2,500 requests over 20 minutes) through the demo's steps, replays on the stand-in."""
    root = tmp_path_factory.mktemp("demo_like")
    trace = root / "to-c.jsonl"
    synth_to_file("to-c", 1, trace, num_requests=2500, duration_s=1200.0)
    run = root / "run"
    ingest_trace(trace, run)
    run_analyses(open_run(run))
    policy = root / "policy.json"
    fit_policy(run, policy, train="0:600", test="600:", capacities="0.125L,0.5L,2L", jobs=1)
    simulate_run(run, SimulateOptions(policies="all,fitted,oracle-dead", capacities="0.125L,0.25L,0.5L,1L,2L,4L",
                                      params_path=policy, ablation=True, jobs=1))
    httpd = serve(StandInState(block_size=32))
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        for name in ("lru", "fitted"):
            run_replay(run, url, ReplayOptions(name=name, schedule=ScheduleOptions(speedup=50.0, max_requests=200)))
    finally:
        httpd.shutdown()
        httpd.server_close()
    compare_replays(run / "replay" / "lru", run / "replay" / "fitted")
    return run


def test_page_height_and_chart_ranges(demo_like_run: Path) -> None:
    html = render_report(open_run(demo_like_run))
    with open_page(html) as page:
        wait_until_drawn(page)
        height = page.evaluate("() => document.documentElement.scrollHeight")
        axes: list[dict[str, Any]] = page.evaluate(RANGES_JS)
        first = page.evaluate("() => document.querySelector('main > section').id")
    assert first == "recommendation"
    assert height < MAX_PAGE_HEIGHT_PX, f"the page is {height} px tall"
    assert len(axes) > 20  # the charts were measured
    squeezed = [a for a in axes if a["share"] is not None and a["share"] < MIN_AXIS_SHARE]
    assert squeezed == [], squeezed
