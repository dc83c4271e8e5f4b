"""The figures' registry: each metric declares once how it is shown, compared, constrained and forecast, and the
tables built from it agree with what they declare."""

from __future__ import annotations

from autotune.figures.constraints import ALIASES, parse_constraint
from autotune.figures.metrics import (
    FRONT,
    METRICS,
    PEAK_MEMORY,
    REPORT,
    REPORTED,
    THROUGHPUT,
    TTFT,
    compared,
    constraint_names,
    in_history,
    shown_in,
)
from autotune.strategy.forecast import family


def test_every_shown_metric_writes_a_cell_and_every_column_heading_is_its_own():
    shown = shown_in(REPORT)
    assert set(shown_in(FRONT)) <= set(shown)
    assert all(metric.cell for metric in shown)
    headings = [metric.column_heading for metric in shown]
    assert len(headings) == len(set(headings))


def test_a_cell_and_a_line_write_the_value_in_the_figures_unit():
    figures = {TTFT.name: 0.0441, THROUGHPUT.name: 1219.24, PEAK_MEMORY.name: 0.03006, "peak_memory_bytes": 30.06e6}
    assert TTFT.text(figures) == "44.1 ms" and TTFT.line_text(figures) == "ttft 44.1 ms"
    assert THROUGHPUT.line_text(figures) == "1219.2 tok/s"
    assert PEAK_MEMORY.text(figures) == "30.06 MB"  # from the bytes it names, not the rounded GB
    assert METRICS["top1_agreement"].text(figures) == "-"  # not measured


def test_every_name_constraints_take_reads_as_its_own_metric_and_no_name_is_taken_twice():
    pairs = [alias for metric in REPORTED for alias, _ in metric.aliases]
    assert len(pairs) == len(set(pairs)) and not set(pairs) & set(METRICS)
    assert constraint_names() == ALIASES
    for alias, (name, _) in ALIASES.items():
        assert parse_constraint(f"{alias}<=1").metric == name


def test_compare_history_and_the_forecast_follow_what_each_metric_declares():
    assert [metric.name for metric in compared()][:3] == ["throughput_tok_s", "ttft_s", "tpot_s"]
    assert all(metric.direction is not None for metric in in_history())
    assert {metric.name: family(metric) for metric in REPORTED if family(metric)} == {
        metric.name: metric.forecast for metric in REPORTED if metric.forecast
    }
    assert family(METRICS["itl_p90_s"]) is None and family(METRICS["itl_p95_s"]) == "time"
