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


# Each capacity figure as plotly drew it: its traces' names, and per trace drawn in its SVG (d3 binds each to its
# trace) the name, the points and the line paths.
CURVES = """[...document.querySelectorAll('[id^=fig-capacity-]')].map(d => ({
  id: d.id,
  names: d.data.map(t => t.name),
  drawn: Object.fromEntries([...d.querySelectorAll('.scatterlayer .trace')].map(t => [t.__data__[0].trace.name, [
    t.querySelectorAll('path.point').length, t.querySelectorAll('path.js-line').length]])),
}))"""


def test_capacity_curves_are_drawn_with_the_slo_line_and_the_chosen_point(tmp_path, chromium):
    study, url = fakes.capacity_study(tmp_path / "capacity.db")
    data = collect(study, url)
    path = write_report(data, tmp_path / "capacity.html")
    page = open_page(chromium, path, evaluate={"curves": CURVES})
    assert page.errors == [] and page.requests == [] and page.dialogs == []
    assert page.plots == page.plot_divs == 5 + len(data.cards)  # the study's figures, and a curve per card
    curves = {curve["id"]: curve for curve in page.texts["curves"]}
    assert sorted(curves) == sorted(f"fig-capacity-{card.record.number}" for card in data.cards)
    for card in data.cards:
        curve, drawn = card.curve, curves[f"fig-capacity-{card.record.number}"]
        names = ["decode throughput (tokens/s)", "itl_p95 (ms)", "SLO itl_p95<=6ms"]
        names.append(f"capacity: batch {curve.chosen.size:g}")
        names += ["refused, not measured"] if curve.unmeasured else []
        assert drawn["names"] == names
        measured = len(curve.points) - len(curve.unmeasured)
        by_name = drawn["drawn"]
        assert sorted(by_name) == sorted(names)  # every trace drew into the SVG
        assert by_name["decode throughput (tokens/s)"] == [measured, 1]
        assert by_name["SLO itl_p95<=6ms"] == [0, 1]  # a line across the latency axis
        assert by_name[names[3]] == [1, 0]  # the chosen point
        if curve.unmeasured:
            assert by_name["refused, not measured"] == [1, 0]
