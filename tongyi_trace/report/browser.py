"""Headless Chromium for the report: the screenshot `make demo` keeps, and the page the browser test drives.

Uses the system Chromium (Debian `chromium`, installed by `make browser`) through Playwright's Python
package; Playwright never downloads a browser here. Flags keep Chromium offline and quiet.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tongyi_trace.errors import KvtraceError, UsageError

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1280, "height": 900}
TIMEOUT_MS = 180_000  # generous: a loaded 2-core CI machine parses the 5 MB page slowly


def _playwright() -> Any:
    """playwright.sync_api, or a UsageError saying how to install it."""
    try:
        import playwright.sync_api
    except ImportError:
        raise UsageError("the Python package 'playwright' is missing: pip install -e '.[dev]'") from None
    return playwright.sync_api


def find_chromium() -> Path | None:
    """The Chromium executable ($KVTRACE_CHROMIUM, else `chromium` on PATH), or None when absent."""
    candidate = os.environ.get("KVTRACE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    return Path(candidate) if candidate and Path(candidate).is_file() else None


@contextmanager
def open_page(html: Path) -> Iterator[Page]:
    """A headless Chromium page with HTML loaded (network requests other than file:// are refused)."""
    exe = find_chromium()
    if exe is None:
        raise UsageError("chromium not found: run 'make browser' (installs Debian's chromium) "
                         "or set KVTRACE_CHROMIUM to its path")
    with _playwright().sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(exe), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(TIMEOUT_MS)
            page.set_default_navigation_timeout(TIMEOUT_MS)
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                       else route.abort())
            page.goto(html.resolve().as_uri(), wait_until="load")
            yield page
        finally:
            browser.close()


def wait_until_drawn(page: Page) -> None:
    """Wait until every figure of the report page is drawn (the page's kvReport.ready promise)."""
    page.wait_for_function("() => window.kvReport !== undefined", timeout=TIMEOUT_MS)
    page.evaluate("() => window.kvReport.ready.then(() => true)")


def screenshot(html: Path, png: Path) -> Path:
    """Save a full-page PNG of the report HTML, taken after all figures are drawn; return PNG."""
    playwright = _playwright()
    if not html.is_file():
        raise UsageError(f"{html}: no such report; run 'kvtrace report RUN_DIR' first")
    try:
        with open_page(html) as page:
            wait_until_drawn(page)
            page.screenshot(path=str(png), full_page=True)
    except playwright.Error as e:
        first = (str(e).strip().splitlines() or ["unknown error"])[0]
        raise KvtraceError(f"{html}: headless Chromium could not draw the report ({first}); "
                           "check 'chromium --version' or re-run 'make browser'") from e
    return png
