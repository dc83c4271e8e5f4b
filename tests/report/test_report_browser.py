"""The report of a study with known figures (every section filled) in headless Chromium; no trials run.

The slow tests open the report of the real demo search the same way (tests/e2e/test_report_e2e.py).
"""

from __future__ import annotations

from autotune.report.data import collect
from autotune.report.html import write_report
from tests import fakes
from tests.browser import open_page


def test_known_report_draws_every_figure_and_shows_error_text_as_text(tmp_path, chromium):
    study, url = fakes.known_study(tmp_path / "known.db")
    path = write_report(collect(study, url), tmp_path / "known.html")
    page = open_page(
        chromium,
        path,
        evaluate={
            "injected": "[...document.scripts].filter(s => s.textContent.includes('alert(1)')).length",
            "errors": "[...document.querySelectorAll('.failure-group pre.error')].map(e => e.innerText)",
            "groups": "[...document.querySelectorAll('.failure-group')].map(g => g.dataset.outcome)",
            "cost": "document.querySelector('#cards').innerText.includes('$0.12 per 1M generated tokens')",
        },
    )
    assert page.errors == [] and page.requests == [] and page.dialogs == []
    assert page.plots == page.plot_divs == 5
    assert page.texts["injected"] == 0
    assert f"ValueError: {fakes.SCRIPT}" in page.texts["errors"]
    assert page.texts["groups"] == ["oom", "broken", "error"]
    assert page.texts["cost"] is True
