"""The README's screenshot: a report's top (title, summary, front chart), a dashed line, then its first card.

    python benchmarks/screenshot/report_screenshot.py reports/demo-cpu.html docs/images/report-demo-cpu.png

Headless Chromium (Debian's, as the tests drive it), 1400 px wide; the two parts are stacked by Chromium itself.
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.browser, run as a script

from playwright.sync_api import Page, sync_playwright

from tests.browser import FLAGS

WIDTH = 1400
PLOTS_DRAWN = "document.querySelectorAll('#front .js-plotly-plot .plot-container').length >= 1"


def _clip(page: Page, top: float, bottom: float) -> bytes:
    return page.screenshot(clip={"x": 0, "y": top, "width": WIDTH, "height": bottom - top}, full_page=True)


def _inline(png: bytes) -> str:
    return f"<img src='data:image/png;base64,{base64.b64encode(png).decode()}' style='display:block'>"


def main(report: Path, out: Path) -> None:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=FLAGS)
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(report.resolve().as_uri())
        page.wait_for_function(PLOTS_DRAWN)
        page.wait_for_timeout(1500)  # plotly's transitions
        front = page.locator("#front .js-plotly-plot").first.bounding_box()
        heading = page.locator("#cards h2").bounding_box()
        card = page.locator("#cards .card").first.bounding_box()
        assert front and heading and card, "the report has no front chart or no card"
        top = _clip(page, 0, front["y"] + front["height"] + 10)
        first_card = _clip(page, heading["y"] - 10, card["y"] + card["height"] + 10)
        dashed = "<div style='border-top:2px dashed #888;margin:4px 0'></div>"
        stack = browser.new_page(viewport={"width": WIDTH, "height": 900})
        stack.set_content(f"<html><body style='margin:0'>{_inline(top)}{dashed}{_inline(first_card)}</body></html>")
        stack.screenshot(path=str(out), full_page=True)
        browser.close()
    if errors:
        raise SystemExit(f"the report raised: {errors}")
    print(f"{out}: {out.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
