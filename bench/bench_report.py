"""Benchmark of `kvtrace report` (issue 3): rendering time and HTML size on the default to-C synthetic
trace (~6 M block refs) with the artifacts of analyze and fit (target: < 5 s; HTML a few MB).

The run folder reuses the cached ingest of bench/_common.py (its tables are linked into
.bench/to-c-x1-s1.report/, where analyze and fit write once). Prints: in-process render time (best of
3), the `kvtrace report` command's wall time (includes Python start-up and imports), the HTML size and
the number of figures, and the headless-Chromium screenshot time when chromium is installed.
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

from _common import ingested_run, kvtrace

from tongyi_trace.report import render_report, screenshot
from tongyi_trace.report.browser import find_chromium
from tongyi_trace.run import open_run

TARGET_S = 5.0
REPEATS = 3


def report_run() -> Path:
    """A run folder with the ingest of the default to-C trace plus analyze and fit artifacts."""
    src = ingested_run("to-c")
    run = src.with_suffix(".report")
    run.mkdir(exist_ok=True)
    for name in ("provenance.json", "requests.parquet", "blocks.parquet"):
        link = run / name
        if not link.exists():
            link.symlink_to(src / name)
    if not (run / "analysis" / "summary.json").exists():
        print(f"analyze: {kvtrace('analyze', str(run), '-q'):.1f} s (once)")
    if not (run / "fit" / "train_test.json").exists():
        print(f"fit: {kvtrace('fit', str(run), '--train', '0:3600', '--test', '3600:', '-q'):.1f} s (once)")
    return run


def main() -> None:
    run = open_run(report_run())
    walls = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        html = render_report(run)
        walls.append(time.perf_counter() - t0)
    size_mb = html.stat().st_size / 1e6
    num_figures = len(re.findall(r'class="kv-plot"', html.read_text()))
    cli_s = kvtrace("report", str(run.path), "-q")
    print(f"render_report (in process, best of {REPEATS}): {min(walls):.2f} s (target < {TARGET_S:g} s)")
    print(f"kvtrace report (child process, incl. imports): {cli_s:.2f} s")
    print(f"report.html: {size_mb:.2f} MB, {num_figures} figures")
    if find_chromium() is None:
        print("screenshot: skipped (chromium not installed: make browser)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        png = screenshot(html, Path(tmp) / "report.png")
        print(f"screenshot (headless Chromium, full page): {time.perf_counter() - t0:.2f} s, "
              f"{png.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
