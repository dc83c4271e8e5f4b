"""A capacity probe's chart (plotly): what a configuration carried at each size and its latency, the SLO's bounds,
the size chosen and the sizes refused, drawn from its curve (report/capacity.py)."""

from __future__ import annotations

from html import escape

import plotly.graph_objects as go

from autotune.figures.capacity import REFUSED_WHY
from autotune.report.capacity import CapacityCurve, CurvePoint, SloLine
from autotune.units import format_bytes

CARRIED_COLOUR = "#1f5fa8"
LATENCY_COLOURS = ("#e07b00", "#2a9d8f", "#8e44ad", "#7f7f7f")
REFUSED_COLOUR = "#c0392b"


def capacity_chart(curve: CapacityCurve) -> go.Figure:
    """What a configuration carried at each size of its probe (left axis) and its latency (right axis), the SLO's
    bounds across the latency axis, the size chosen, and the sizes refused with no figures (out of memory, or
    predicted not to fit) at the foot of the chart."""
    unit, measured = curve.unit, [point for point in curve.points if point.carried is not None]
    chart = go.Figure()
    chart.add_trace(_carried_trace(curve, measured))
    colours = dict(zip(curve.latency_figures, LATENCY_COLOURS * 4, strict=False))
    for name in curve.latency_figures:
        chart.add_trace(_latency_trace(curve, measured, name, colours[name]))
    sizes = [point.size for point in curve.points]
    for line in curve.slo_lines:
        chart.add_trace(_slo_trace(line, sizes, colours.get(line.figure, REFUSED_COLOUR)))
    _mark_chosen(chart, curve)
    _mark_unmeasured(chart, curve)
    # Headroom above the highest latency and bound: the SLO's line stays clear of the top of the chart.
    latencies = [value * 1000 for p in measured for value in p.latency.values()]
    top = max([*latencies, *(line.bound_s * 1000 for line in curve.slo_lines)], default=1.0) * 1.3
    chart.update_layout(
        title=f"Trial #{curve.number}: {unit.carried_axis.split(' (')[0]} and latency against {unit.axis}",
        xaxis=_size_axis(unit.axis, sizes),
        yaxis={"title": unit.carried_axis, "rangemode": "tozero"},
        yaxis2={"title": "latency (ms)", "overlaying": "y", "side": "right", "range": [0, top], "showgrid": False},
        height=420,
        legend={"orientation": "h", "y": -0.25},
        margin={"t": 60},
    )
    return chart


def _carried_trace(curve: CapacityCurve, measured: list[CurvePoint]) -> go.Scatter:
    """What each measured size carried, the refused ones crossed out with why."""
    return go.Scatter(
        x=[point.size for point in measured],
        y=[point.carried for point in measured],
        name=curve.unit.carried_axis,
        mode="lines+markers+text",
        line={"color": CARRIED_COLOUR, "width": 3},
        marker={
            "size": [10 if p.verdict == "met" else 16 for p in measured],
            "symbol": ["circle" if p.verdict == "met" else "x" for p in measured],
            "color": [CARRIED_COLOUR if p.verdict == "met" else REFUSED_COLOUR for p in measured],
        },
        text=["" if p.verdict == "met" else REFUSED_WHY.get(p.verdict, p.verdict) for p in measured],
        textposition="bottom left",
        textfont={"color": REFUSED_COLOUR},
        hovertext=[_curve_hover(curve, point) for point in measured],
        hoverinfo="text",
    )


def _latency_trace(curve: CapacityCurve, measured: list[CurvePoint], name: str, colour: str) -> go.Scatter:
    with_it = [point for point in measured if name in point.latency]
    return go.Scatter(
        x=[point.size for point in with_it],
        y=[point.latency[name] * 1000 for point in with_it],
        name=f"{name.removesuffix('_s')} (ms)",
        mode="lines+markers",
        line={"color": colour, "dash": "dot"},
        yaxis="y2",
        hovertext=[_curve_hover(curve, point) for point in with_it],
        hoverinfo="text",
    )


def _slo_trace(line: SloLine, sizes: list[float], colour: str) -> go.Scatter:
    return go.Scatter(
        x=[min(sizes), max(sizes)],
        y=[line.bound_s * 1000] * 2,
        name=line.label,
        mode="lines",
        line={"color": colour, "dash": "dash", "width": 2},
        yaxis="y2",
        hoverinfo="name",
    )


def _mark_chosen(chart: go.Figure, curve: CapacityCurve) -> None:
    chosen = curve.chosen
    if chosen is None or chosen.carried is None:
        return
    chart.add_trace(
        go.Scatter(
            x=[chosen.size],
            y=[chosen.carried],
            name=f"capacity: {curve.unit.size_text(chosen.size)}",
            mode="markers+text",
            text=[f"capacity: {curve.unit.size_text(chosen.size)}"],
            textposition="top left",
            marker={"symbol": "star", "size": 22, "color": "#f1c40f", "line": {"width": 1.5, "color": "#222"}},
            hovertext=[_curve_hover(curve, chosen)],
            hoverinfo="text",
        )
    )


def _mark_unmeasured(chart: go.Figure, curve: CapacityCurve) -> None:
    """Sizes refused with no figures, on the size axis: why each was not measured, in its hover text."""
    unmeasured = curve.unmeasured
    if not unmeasured:
        return
    chart.add_trace(
        go.Scatter(
            x=[point.size for point in unmeasured],
            y=[0.0] * len(unmeasured),
            name="refused, not measured",
            mode="markers+text",
            text=[REFUSED_WHY.get(point.verdict, point.verdict) for point in unmeasured],
            textposition="top center",
            marker={"symbol": "x-thin-open", "size": 16, "color": REFUSED_COLOUR, "line": {"width": 3}},
            hovertext=[_curve_hover(curve, point) for point in unmeasured],
            hoverinfo="text",
        )
    )


def _size_axis(title: str, sizes: list[float]) -> dict:
    """Sizes that span a decade or more (a doubling ladder) on a log axis, each size a tick."""
    spread = max(sizes) / min(sizes) if sizes and min(sizes) > 0 else 1
    ticks = sorted(set(sizes))
    axis_type = "log" if spread >= 8 else "linear"
    return {"title": title, "type": axis_type, "tickvals": ticks, "ticktext": [f"{size:g}" for size in ticks]}


def _curve_hover(curve: CapacityCurve, point: CurvePoint) -> str:
    lines = [f"<b>{escape(curve.unit.size_text(point.size))}</b>"]
    if point.carried is not None:
        lines.append(f"{point.carried:.4g} {escape(curve.unit.carried_axis)}")
    lines += [f"{escape(name.removesuffix('_s'))} {value * 1000:.3g} ms" for name, value in point.latency.items()]
    if point.share is not None:
        lines.append(f"{point.share:.0%} of its requests within the SLO")
    if point.memory_bytes is not None:
        lines.append(f"peak memory {format_bytes(point.memory_bytes)}")
    refused = REFUSED_WHY.get(point.verdict, point.verdict)
    verdict = "within the SLO" if point.verdict == "met" else f"refused, {refused}"
    lines.append(escape(f"{verdict}: {point.reason}" if point.reason else verdict))
    return "<br>".join(lines)
