"""The nights of a series side by side, as one self-contained HTML page: a chart and a table.

The chart has a row per figure (throughput, peak memory, KL, capacity where nights probed one, and where some night
measured them the degenerate share, and the task's accuracy and flips) and a column per night: every front point as a
small grey dot, the front's best as a line (for capacity, the fastest point's), and a red cross where a night
regressed on that figure.
Every text from a study (names, configurations) is escaped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from autotune.analysis.capacity import AtCapacity
from autotune.analysis.history import FrontPoint, History, NightSummary
from autotune.figures.metrics import KL_FLOOR, Metric, in_history
from autotune.report.history_table import history_headings, night_cells
from autotune.report.pages import write_page
from autotune.space.knobs import short_name


@dataclass(frozen=True)
class Row:
    """One figure of the chart: how to read it from a front point, its best, and its axis."""

    figure: str  # as regressions name it: throughput, memory, KL, task accuracy, answer flips vs reference
    title: str
    value: Callable[[FrontPoint], float | None]
    best: Callable[[NightSummary], float | None]
    log: bool = False
    share: bool = False  # a share of items or generations: its axis in percent


def _kl_shown(kl: float | None) -> float | None:
    """KL on a log axis: the reference's 0 (and noise below the floor) drawn at the floor."""
    return None if kl is None else max(kl, KL_FLOOR)


def _capacity(found: AtCapacity | None) -> float | None:
    return found.size if found is not None else None


ROWS = (
    Row("throughput", "best throughput (tok/s)", lambda p: p.throughput, lambda n: n.best_throughput),
    Row("memory", "lowest peak memory (GB)", lambda p: p.memory_gb, lambda n: n.lowest_memory_gb),
    Row("KL", "lowest KL vs reference (nats/token)", lambda p: _kl_shown(p.kl), lambda n: _kl_shown(n.lowest_kl), True),
)
# Where nights probed capacities: each front point's, and the fastest point's as the line (its SLO: the table's).
CAPACITY_ROW = Row(
    "capacity",
    "capacity (batch or load within the SLO)",
    lambda p: _capacity(p.capacity),
    lambda n: _capacity(n.fastest_capacity),
    log=True,
)


def _share_row(metric: Metric) -> Row:
    """A figure measured on some nights only (the degenerate share, the task's accuracy and flips): its row."""
    best = "best" if metric.direction == "maximize" else "lowest"
    return Row(
        metric.label,
        f"{best} {metric.label}",
        lambda point: point.figures.get(metric.name),
        lambda night: night.best(metric),
        share=True,
    )


def rows_of(history: History) -> tuple[Row, ...]:
    probed = any(point.capacity for night in history.nights for point in night.points)
    measured = tuple(_share_row(metric) for metric in in_history() if metric.optional and history.shows(metric))
    return (*ROWS, *((CAPACITY_ROW,) if probed else ()), *measured)


def write_history(history: History, title: str, path: Path) -> Path:
    return write_page(
        render_history(history, title), path, "the studies are untouched: run the same `autotune history` again"
    )


def render_history(history: History, title: str) -> str:
    figure = history_figure(history)
    chart = figure.to_html(full_html=False, include_plotlyjs=False, div_id="history", config={"displaylogo": False})
    return _PAGE.format(
        title=escape(f"autotune history: {title}"),
        heading=escape(f"autotune history: {title}"),
        summary=escape(_summary(history)),
        plotly=get_plotlyjs(),
        chart=chart,
        table=_table(history),
    )


def history_figure(history: History) -> go.Figure:
    labels = [night.label for night in history.nights]
    rows = rows_of(history)
    figure = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, subplot_titles=[row.title for row in rows])
    for index, row in enumerate(rows, start=1):
        first = index == 1
        for trace in (
            _points_trace(history, row, first),
            _best_trace(history, row, first),
            _regressed_trace(history, row, first),
        ):
            figure.add_trace(trace, row=index, col=1)
        if row.log:
            figure.update_yaxes(type="log", row=index, col=1)
        if row.share:
            figure.update_yaxes(tickformat=".0%", row=index, col=1)
    figure.update_xaxes(type="category", categoryorder="array", categoryarray=labels)
    figure.update_layout(height=190 * len(rows) + 190, margin={"t": 60}, legend={"orientation": "h", "y": 1.08})
    return figure


def _points_trace(history: History, row: Row, first: bool) -> go.Scatter:
    """Every front point of every night, a small grey dot."""
    points = [(night, point) for night in history.nights for point in night.points]
    return go.Scatter(
        x=[night.label for night, _ in points],
        y=[row.value(point) for _, point in points],
        mode="markers",
        marker={"color": "#999", "size": 6},
        name="front points",
        legendgroup="points",
        showlegend=first,
        hovertext=[_point_text(night, point) for night, point in points],
        hoverinfo="text+y",
    )


def _best_trace(history: History, row: Row, first: bool) -> go.Scatter:
    """Each night's best of the front, as a line."""
    return go.Scatter(
        x=[night.label for night in history.nights],
        y=[row.best(night) for night in history.nights],
        mode="lines+markers",
        line={"color": "#1f5fa8"},
        name="best of the front",
        legendgroup="best",
        showlegend=first,
        hovertext=[escape(night.study) for night in history.nights],
    )


def _regressed_trace(history: History, row: Row, first: bool) -> go.Scatter:
    """A red cross where a night regressed on this row's figure."""
    regressed = [night for night in history.nights if row.figure in night.regressed]
    return go.Scatter(
        x=[night.label for night in regressed],
        y=[row.best(night) for night in regressed],
        mode="markers",
        marker={"color": "#c0392b", "symbol": "x", "size": 14},
        name="regressed since the night before",
        legendgroup="regressed",
        showlegend=first,
        hovertext=[escape(f"{night.study}: {night.verdict()}") for night in regressed],
        hoverinfo="text",
    )


def _point_text(night: NightSummary, point: FrontPoint) -> str:
    knobs = " ".join(f"{short_name(name)}={value}" for name, value in point.config.items())
    return escape(f"{night.study} #{point.number}: {knobs}")


def _summary(history: History) -> str:
    regressed = history.regressed
    marked = ", ".join(night.label for night in regressed) if regressed else "none"
    return (
        f"{len(history.nights)} nights, {history.nights[0].label} to {history.nights[-1].label}; "
        f"regressed since the night before: {marked} (tolerances of autotune compare)"
    )


def _table(history: History) -> str:
    rows = []
    for night in history.nights:
        css = "regressed" if night.regressed else "ok"
        cells = night_cells(history, night)
        rows.append(f"<tr class='{css}'>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells) + "</tr>")
    head = "".join(f"<th>{escape(name)}</th>" for name in history_headings(history))
    return f"<table id='nights'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }}
table {{ border-collapse: collapse; width: 100%; font-size: 0.85em; margin-top: 1em; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 4px 6px; text-align: left; }}
tr.regressed td:last-child {{ color: #b02a2a; font-weight: bold; }}
</style>
<script type="text/javascript">{plotly}</script>
</head><body>
<h1>{heading}</h1>
<p>{summary}</p>
{chart}
{table}
</body></html>
"""
