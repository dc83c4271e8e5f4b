"""The nights of a series side by side, as one self-contained HTML page: a chart and a table.

The chart has a row per figure (throughput, peak memory, KL, and capacity where nights probed one) and a column per
night: every front point as a small grey dot, the front's best as a line (for capacity, the fastest point's), and a
red cross where a night regressed on that figure.
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
from autotune.figures.metrics import KL_FLOOR
from autotune.figures.slo import describe_slo
from autotune.report.pages import write_page
from autotune.space.knobs import short_name
from autotune.units import format_bytes


@dataclass(frozen=True)
class Row:
    """One figure of the chart: how to read it from a front point, its best, and its axis."""

    figure: str  # as regressions name it: throughput, memory, KL
    title: str
    value: Callable[[FrontPoint], float | None]
    best: Callable[[NightSummary], float | None]
    log: bool = False


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


def rows_of(history: History) -> tuple[Row, ...]:
    probed = any(point.capacity for night in history.nights for point in night.points)
    return (*ROWS, CAPACITY_ROW) if probed else ROWS


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
        points = [(night, point) for night in history.nights for point in night.points]
        figure.add_trace(
            go.Scatter(
                x=[night.label for night, _ in points],
                y=[row.value(point) for _, point in points],
                mode="markers",
                marker={"color": "#999", "size": 6},
                name="front points",
                legendgroup="points",
                showlegend=first,
                hovertext=[_point_text(night, point) for night, point in points],
                hoverinfo="text+y",
            ),
            row=index,
            col=1,
        )
        figure.add_trace(
            go.Scatter(
                x=labels,
                y=[row.best(night) for night in history.nights],
                mode="lines+markers",
                line={"color": "#1f5fa8"},
                name="best of the front",
                legendgroup="best",
                showlegend=first,
                hovertext=[escape(night.study) for night in history.nights],
            ),
            row=index,
            col=1,
        )
        regressed = [night for night in history.nights if row.figure in night.regressed]
        figure.add_trace(
            go.Scatter(
                x=[night.label for night in regressed],
                y=[row.best(night) for night in regressed],
                mode="markers",
                marker={"color": "#c0392b", "symbol": "x", "size": 14},
                name="regressed since the night before",
                legendgroup="regressed",
                showlegend=first,
                hovertext=[escape(f"{night.study}: {night.verdict()}") for night in regressed],
                hoverinfo="text",
            ),
            row=index,
            col=1,
        )
        if row.log:
            figure.update_yaxes(type="log", row=index, col=1)
    figure.update_xaxes(type="category", categoryorder="array", categoryarray=labels)
    figure.update_layout(height=190 * len(rows) + 190, margin={"t": 60}, legend={"orientation": "h", "y": 1.08})
    return figure


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


HEADINGS = (
    "night",
    "study",
    "trials",
    "front",
    "best tok/s",
    "lowest memory",
    "lowest KL",
    "best tokens / greedy",
    "vs the night before",
)
CAPACITY_HEADINGS = ("SLO", "capacity of the fastest")


def history_headings(history: History) -> tuple[str, ...]:
    """The nights' columns (this page's table and `autotune history`'s); where a night was searched within an SLO,
    the SLO and the fastest point's capacity before the verdict: its row's figures are at capacity within that SLO."""
    if not any(night.target or night.fastest_capacity for night in history.nights):
        return HEADINGS
    return (*HEADINGS[:-1], *CAPACITY_HEADINGS, HEADINGS[-1])


def night_cells(history: History, night: NightSummary) -> list[str]:
    """One night's row under history_headings."""
    change = night.best_change(history.before(night))
    cells = [
        night.label,
        night.study,
        str(night.launched),
        str(len(night.points)),
        _number(night.best_throughput, "{:.1f}") + (f" ({change:+.1%})" if change is not None else ""),
        format_bytes(night.lowest_memory_gb * 1e9) if night.lowest_memory_gb is not None else "-",
        _number(night.lowest_kl, "{:.2e}"),
        f"{_percent(night.best_token_agreement)} / {_percent(night.best_greedy_agreement)}",
    ]
    if len(history_headings(history)) > len(HEADINGS):
        cells += [describe_slo(night.target.slo) if night.target else "none", _fastest(night.fastest_capacity)]
    return [*cells, night.verdict()]


def _fastest(found: AtCapacity | None) -> str:
    """ "batch 16: 2055 generated tok/s end to end per GPU, $0.137 per 1M tokens"."""
    if found is None or found.size is None or found.tokens_per_s_per_device is None:
        return "-"
    figures = f"{found.tokens_per_s_per_device:.4g} generated tok/s end to end per {found.device}"
    cost = found.cost_per_million_tokens
    return f"{found.unit.size_text(found.size)}: {figures}" + (f", ${cost:.4g} per 1M tokens" if cost else "")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _number(value: float | None, template: str) -> str:
    return "-" if value is None else template.format(value)


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
