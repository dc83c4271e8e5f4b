"""The decode ceiling in the report: shown where the study stores one, the fastest feasible trial set against it
only where the hand loop ran the study's workload."""

from __future__ import annotations

import pytest

from autotune.report.data import collect
from autotune.report.html import render
from autotune.study.ceilings import add_ceilings
from tests import fakes
from tests.study.test_ceilings import ceiling, prepared_study


def test_the_report_sets_the_fastest_trial_against_the_ceiling_of_the_same_workload(tmp_path):
    study, url = prepared_study(tmp_path)
    assert 'id="ceiling"' not in render(collect(study, url))  # no figure stored: no section
    add_ceilings(study, [ceiling(8, 500.0), ceiling(1, 80.0)])
    data = collect(study, url)
    same, other = {row.figure["batch_size"]: row for row in data.ceilings}[8], data.ceilings[0]
    assert same.best is not None and same.best.number == 3  # the compiled trial, 400 tok/s, at batch 8 as the study
    assert same.fraction == pytest.approx(0.8)
    assert other.figure["batch_size"] == 1 and other.best is None and other.fraction is None
    html = render(data)
    section = html[html.index('<section id="ceiling">') :].split("</section>", 1)[0]
    assert "autotune ceiling" in section
    assert "<td>#3: 400.0 tok/s</td><td>0.80x</td>" in section
    assert "<td>1</td><td>128 / 64</td><td>bfloat16, compile reduce-overhead</td><td>80.0</td>" in section
    assert "another workload" in section


def test_a_capacity_study_sets_the_probe_point_at_the_ceilings_batch_against_it(tmp_path):
    """A capacity search's trials carry figures at their capacity (batch 32 here), and at each batch they probed: the
    H100's 8B study showed 'another workload' beside the hand loop at batch 1 and 8, both of which every probe ran."""
    study, url = prepared_study(tmp_path, fakes.capacity_study)
    add_ceilings(study, [ceiling(1, 100.0), ceiling(8, 800.0, measured_at="x")])
    rows = {row.figure["batch_size"]: row for row in collect(study, url).ceilings}
    compiled = fakes.STACKS["compiled"]  # the fastest at every batch, trial #2
    assert rows[1].best.number == 2 and rows[1].fraction == pytest.approx(compiled.tok_s_at_1 / 100.0)
    assert rows[8].best_tok_s == pytest.approx(compiled.figures(8)["throughput_tok_s"])
    section = render(collect(study, url)).split('<section id="ceiling">', 1)[1].split("</section>", 1)[0]
    assert "another workload" not in section
    assert f"<td>#2: {compiled.tok_s_at_1:.1f} tok/s</td><td>1.20x</td>" in section
    assert "<td>stored " in section and "<td>x, torch" in section  # when measured, where the figure says it
