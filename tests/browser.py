"""Headless Chromium (Debian's package, driven by Playwright) for report tests.

`open_page` loads a file, waits until plotly has drawn every figure, and returns what a reader would
check: the DOM after scripts ran, the page's own console errors and uncaught exceptions (kept apart
from Chromium's notices about its software WebGL), requests that left the file, and a screenshot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# Flags for a headless browser with no sandbox, no GPU and no background traffic.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Chromium's own notices, not the page's: its software WebGL (SwiftShader) driver and canvas read-back
# hints. They arrive as warnings; an error is always the page's, unless it is a GL driver message.
BROWSER_NOTICES = re.compile(r"GL Driver Message|GPU stall due to ReadPixels|willReadFrequently")


@dataclass
class Page:
    dom: str
    errors: list[str] = field(default_factory=list)  # console errors and uncaught exceptions of the page
    warnings: list[str] = field(default_factory=list)  # console warnings of the page
    notices: list[str] = field(default_factory=list)  # Chromium's WebGL/canvas notices, for the record
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, other than itself
    dialogs: list[str] = field(default_factory=list)  # alert(), confirm(), prompt() the page opened
    plots: int = 0  # plot divs plotly has drawn into
    plot_divs: int = 0  # plot divs on the page
    texts: dict[str, str] = field(default_factory=dict)  # results of the `evaluate` expressions


def open_page(
    chromium: str,
    path: Path,
    screenshot: Path | None = None,
    evaluate: dict[str, str] | None = None,
    width: int = 1300,
) -> Page:
    from playwright.sync_api import sync_playwright

    url = path.resolve().as_uri()
    page_result = Page(dom="")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.on("console", lambda message: _console(page_result, message.type, message.text))
            page.on("pageerror", lambda error: page_result.errors.append(f"uncaught: {error}"))
            page.on("request", lambda request: request.url != url and page_result.requests.append(request.url))
            page.on("dialog", lambda dialog: (page_result.dialogs.append(dialog.message), dialog.dismiss()))
            page.goto(url, wait_until="load", timeout=120_000)
            # plotly draws asynchronously: wait until every plot div holds a drawn figure.
            page.wait_for_function(
                "() => [...document.querySelectorAll('.plotly-graph-div')]"
                ".every(d => d._fullLayout && d.querySelector('.main-svg'))",
                timeout=60_000,
            )
            page.wait_for_timeout(500)
            page_result.plot_divs = page.evaluate("document.querySelectorAll('.plotly-graph-div').length")
            page_result.plots = page.evaluate(
                "[...document.querySelectorAll('.plotly-graph-div')].filter(d => d.querySelector('.main-svg')).length"
            )
            for name, expression in (evaluate or {}).items():
                page_result.texts[name] = page.evaluate(expression)
            page_result.dom = page.content()
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return page_result


def _console(page: Page, kind: str, text: str) -> None:
    if BROWSER_NOTICES.search(text) and (kind != "error" or "GL Driver Message" in text):
        page.notices.append(text)
    elif kind == "error":
        page.errors.append(text)
    elif kind == "warning":
        page.warnings.append(text)
