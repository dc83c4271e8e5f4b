"""The report's plotly figures, drawn from its data (autotune/report/data.py); the page that holds them is
autotune/report/html.py.

Every text from a trial is escaped before it reaches a figure's hover text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

import plotly.graph_objects as go

from autotune.figures.metrics import KL_DIVERGENCE, METRICS, THROUGHPUT, TTFT, Metric
from autotune.report.data import CapacityCurve, CurvePoint, Progress, ReportData
from autotune.study import TrialRecord
from autotune.study.opened import Terms
from autotune.units import format_bytes, format_duration
from autotune.workloads.capacity import REFUSED_WHY


def _knob_text(record: TrialRecord) -> str:
    return "<br>".join(f"{escape(str(k))}={escape(str(v))}" for k, v in record.config.items())


def _hover(record: TrialRecord) -> str:
    m = record.metrics
    roles = f" ({escape(', '.join(record.roles))})" if record.roles else ""
    return (
        f"<b>trial #{record.number}</b>{roles}<br>{_knob_text(record)}<br>"
        f"{m[THROUGHPUT.name]:.1f} tok/s · ttft {m.get(TTFT.name, math.nan) * 1000:.1f} ms<br>"
        f"memory {format_bytes(m.get('peak_memory_bytes'))} · KL {m[KL_DIVERGENCE.name]:.2e}"
    )


def front_chart(
    complete: list[TrialRecord], front: set[int], data: ReportData, objectives: Sequence[Metric]
) -> go.Figure:
    """The first objective against the second (or the first alone), coloured by the third where there is one."""
    y_metric = objectives[0]
    x_metric = objectives[1] if len(objectives) > 1 else None
    colour = objectives[2] if len(objectives) > 2 else None
    figure = go.Figure()
    for on_front in (False, True):
        records = [r for r in complete if (r.number in front) == on_front]
        if not records:
            continue
        marker: dict = {"size": 14 if on_front else 9, "line": {"width": 2 if on_front else 0, "color": "#d62728"}}
        if colour is not None:
            shown = [colour.on_scale(r.metrics[colour.name]) for r in complete]
            marker |= {
                "color": [colour.on_scale(r.metrics[colour.name]) for r in records],
                "colorscale": "Viridis",
                "cmin": math.log10(colour.log_floor) if colour.log_floor else min(shown),
                "cmax": max(shown) + 1e-9,
                "colorbar": {"title": colour.axis_title} if on_front else None,
                "showscale": on_front,
            }
        figure.add_trace(
            go.Scatter(
                x=[_x_value(r, x_metric) for r in records],
                y=[_shown(r, y_metric) for r in records],
                mode="markers",
                name="Pareto front" if on_front else "other trials",
                marker=marker,
                hovertext=[_hover(r) for r in records],
                hoverinfo="text",
            )
        )
    for record, label, symbol in ((data.baseline, "baseline", "star"), (data.reference, "reference", "diamond")):
        if record is not None:
            figure.add_trace(
                go.Scatter(
                    x=[_x_value(record, x_metric)],
                    y=[_shown(record, y_metric)],
                    mode="markers+text",
                    text=[label],
                    textposition="top center",
                    name=label,
                    marker={"symbol": symbol, "size": 18, "color": "rgba(0,0,0,0)", "line": {"width": 2}},
                    hovertext=[_hover(record)],
                    hoverinfo="text",
                )
            )
    against = f" vs {x_metric.heading}" if x_metric else ", trial by trial"
    coloured = f" (colour: {colour.label})" if colour else ""
    figure.update_layout(
        title=f"{y_metric.heading.capitalize()}{against}{coloured}{_at_capacity(data)}",
        xaxis={"title": _axis_title(x_metric) if x_metric else "trial", "type": _axis_type(x_metric)},
        yaxis={"title": _axis_title(y_metric), "type": _axis_type(y_metric)},
        height=520,
        legend={"orientation": "h", "y": -0.2},
    )
    return figure


def _at_capacity(data: ReportData) -> str:
    """Where trials probed capacities, the SLO their figures hold within, and what those with none show."""
    if not data.capacities:
        return ""
    none = any(found.size is None for found in data.capacities.values())
    return f"<br>at each one's capacity {escape(Terms.of(data.settings).target.within)}" + (
        " (trials with none: figures past the SLO)" if none else ""
    )


def _x_value(record: TrialRecord, metric: Metric | None) -> float:
    return _shown(record, metric) if metric is not None else record.number


def _axis_type(metric: Metric | None) -> str:
    return "log" if metric is not None and metric.log_floor else "linear"


def _axis_title(metric: Metric) -> str:
    """On the figure's own scale (a log axis shows KL as it is, not its log10)."""
    return f"{metric.heading} ({metric.unit})" if metric.unit and metric.unit != "nats/token" else metric.heading


def three_d_chart(
    complete: list[TrialRecord], front: set[int], data: ReportData, objectives: Sequence[Metric]
) -> go.Figure:
    y_metric, x_metric, z_metric = objectives[:3]
    figure = go.Figure(
        go.Scatter3d(
            x=[_shown(r, x_metric) for r in complete],
            y=[_shown(r, y_metric) for r in complete],
            z=[_shown(r, z_metric) for r in complete],
            mode="markers",
            name="trials",
            marker={
                "size": [8 if r.number in front else 4 for r in complete],
                "color": ["#d62728" if r.number in front else "#7f7f7f" for r in complete],
            },
            hovertext=[_hover(r) for r in complete],
            hoverinfo="text",
        )
    )
    for record, label, symbol in ((data.baseline, "baseline", "cross"), (data.reference, "reference", "diamond")):
        if record is not None:
            figure.add_trace(
                go.Scatter3d(
                    x=[_shown(record, x_metric)],
                    y=[_shown(record, y_metric)],
                    z=[_shown(record, z_metric)],
                    mode="markers+text",
                    text=[label],
                    name=label,
                    marker={"symbol": symbol, "size": 10, "color": "#1f77b4"},
                    hovertext=[_hover(record)],
                    hoverinfo="text",
                )
            )
    scene: dict = {"camera": {"eye": {"x": 1.6, "y": -1.6, "z": 0.8}}}  # far enough that no axis is cut off
    for axis, metric in (("xaxis", x_metric), ("yaxis", y_metric), ("zaxis", z_metric)):
        scene[f"{axis}_title"] = _axis_title(metric)
        if metric.log_floor:
            scene[f"{axis}_type"] = "log"
    title = "All three objectives" if len(objectives) == 3 else "The first three objectives"
    figure.update_layout(
        title=f"{title} (red: Pareto front){_at_capacity(data)}",
        scene=scene,
        height=600,
        margin={"l": 0, "r": 0, "b": 0, "t": 60},
    )
    return figure


def _shown(record: TrialRecord, metric: Metric) -> float:
    """The figure as a 3-D axis shows it: above its floor where the axis is logarithmic."""
    value = record.metrics[metric.name]
    return max(value, metric.log_floor) if metric.log_floor else value


def importance_chart(by_objective: dict[str, dict[str, float]]) -> go.Figure:
    knobs = sorted({knob for shares in by_objective.values() for knob in shares})
    figure = go.Figure()
    for objective, shares in by_objective.items():
        label = METRICS[objective].heading
        figure.add_trace(
            go.Bar(
                y=knobs,
                x=[shares.get(knob, 0.0) for knob in knobs],
                orientation="h",
                name=label,
                hovertemplate="%{y}: %{x:.0%}<extra>" + escape(label) + "</extra>",
            )
        )
    figure.update_layout(
        title="How much each knob matters, per objective (Optuna PED-ANOVA importance)",
        barmode="group",
        xaxis={"title": "share of importance", "tickformat": ".0%"},
        height=160 + 60 * len(knobs),
        legend={"orientation": "h", "y": -0.25},
    )
    return figure


def parallel_chart(data: ReportData) -> go.Figure:
    assert data.parallel is not None
    dimensions = []
    for axis in data.parallel.axes:
        dimension: dict = {"label": axis.label, "values": axis.values}
        if axis.ticks is not None:
            dimension |= {"tickvals": list(range(len(axis.ticks))), "ticktext": [str(t) for t in axis.ticks]}
            dimension["range"] = [-0.3, len(axis.ticks) - 0.7]
        dimensions.append(dimension)
    figure = go.Figure(
        go.Parcoords(
            dimensions=dimensions,
            line={
                "color": data.parallel.colour,
                "colorscale": "Viridis",
                "showscale": True,
                "colorbar": {"title": "tok/s"},
            },
        )
    )
    figure.update_layout(
        title=f"All {len(data.parallel.numbers)} complete trials: knobs and objectives (colour: throughput)",
        height=480,
        margin={"l": 80, "r": 80, "t": 90},
    )
    return figure


def progress_chart(progress: Progress) -> go.Figure:
    """The hypervolume of the front and the best figures so far, trial by trial."""
    labels = [f"#{n}" for n in progress.numbers]
    spent = zip(progress.numbers, progress.trial_time_s, strict=True)
    hover = [f"after trial #{n}, {format_duration(t)} in trials" for n, t in spent]
    figure = go.Figure()
    figure.add_trace(
        go.Scatter(
            x=labels,
            y=progress.hypervolume,
            name="hypervolume (share of final)",
            mode="lines+markers",
            line={"shape": "hv"},
            hovertext=hover,
        )
    )
    figure.add_trace(
        go.Scatter(
            x=labels,
            y=progress.best_throughput,
            name="best throughput so far (tok/s)",
            mode="lines",
            line={"shape": "hv", "dash": "dot"},
            yaxis="y2",
        )
    )
    figure.add_trace(
        go.Scatter(
            x=labels,
            y=progress.best_memory,
            name="lowest peak memory so far (GB)",
            mode="lines",
            line={"shape": "hv", "dash": "dash"},
            yaxis="y3",
        )
    )
    figure.update_layout(
        title="Hypervolume of the front and best-so-far, trial by trial",
        xaxis={"title": "launched trials, in order", "type": "category", "domain": [0, 0.86]},
        yaxis={"title": "hypervolume", "tickformat": ".0%", "range": [0, 1.05]},
        yaxis2={"title": "tok/s", "overlaying": "y", "side": "right", "showgrid": False, "rangemode": "tozero"},
        yaxis3={
            "title": "GB",
            "overlaying": "y",
            "side": "right",
            "position": 0.96,
            "anchor": "free",
            "showgrid": False,
            "rangemode": "tozero",
        },
        height=420,
        legend={"orientation": "h", "y": -0.3},
    )
    return figure


# -------------------------------------------------------------------------------------------- capacity

CARRIED_COLOUR = "#1f5fa8"
LATENCY_COLOURS = ("#e07b00", "#2a9d8f", "#8e44ad", "#7f7f7f")
REFUSED_COLOUR = "#c0392b"


def capacity_chart(curve: CapacityCurve) -> go.Figure:
    """What a configuration carried at each size of its probe (left axis) and its latency (right axis), the SLO's
    bounds across the latency axis, the size chosen, and the sizes refused with no figures (out of memory, or
    predicted not to fit) at the foot of the chart."""
    unit, measured = curve.unit, [point for point in curve.points if point.carried is not None]
    figure = go.Figure()
    figure.add_trace(
        go.Scatter(
            x=[point.size for point in measured],
            y=[point.carried for point in measured],
            name=unit.carried_axis,
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
    )
    colours = dict(zip(curve.latency_figures, LATENCY_COLOURS * 4, strict=False))
    for name in curve.latency_figures:
        with_it = [point for point in measured if name in point.latency]
        figure.add_trace(
            go.Scatter(
                x=[point.size for point in with_it],
                y=[point.latency[name] * 1000 for point in with_it],
                name=f"{name.removesuffix('_s')} (ms)",
                mode="lines+markers",
                line={"color": colours[name], "dash": "dot"},
                yaxis="y2",
                hovertext=[_curve_hover(curve, point) for point in with_it],
                hoverinfo="text",
            )
        )
    sizes = [point.size for point in curve.points]
    for line in curve.slo_lines:
        figure.add_trace(
            go.Scatter(
                x=[min(sizes), max(sizes)],
                y=[line.bound_s * 1000] * 2,
                name=line.label,
                mode="lines",
                line={"color": colours.get(line.figure, REFUSED_COLOUR), "dash": "dash", "width": 2},
                yaxis="y2",
                hoverinfo="name",
            )
        )
    _mark_chosen(figure, curve)
    _mark_unmeasured(figure, curve)
    # Headroom above the highest latency and bound: the SLO's line stays clear of the top of the chart.
    latencies = [value * 1000 for p in measured for value in p.latency.values()]
    top = max([*latencies, *(line.bound_s * 1000 for line in curve.slo_lines)], default=1.0) * 1.3
    figure.update_layout(
        title=f"Trial #{curve.number}: {unit.carried_axis.split(' (')[0]} and latency against {unit.axis}",
        xaxis=_size_axis(unit.axis, sizes),
        yaxis={"title": unit.carried_axis, "rangemode": "tozero"},
        yaxis2={"title": "latency (ms)", "overlaying": "y", "side": "right", "range": [0, top], "showgrid": False},
        height=420,
        legend={"orientation": "h", "y": -0.25},
        margin={"t": 60},
    )
    return figure


def _mark_chosen(figure: go.Figure, curve: CapacityCurve) -> None:
    chosen = curve.chosen
    if chosen is None or chosen.carried is None:
        return
    figure.add_trace(
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


def _mark_unmeasured(figure: go.Figure, curve: CapacityCurve) -> None:
    """Sizes refused with no figures, on the size axis: why each was not measured, in its hover text."""
    unmeasured = curve.unmeasured
    if not unmeasured:
        return
    figure.add_trace(
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
