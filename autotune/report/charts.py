"""The report's plotly charts, drawn from its data (autotune/report/data.py); the page that holds them is
autotune/report/html.py.

Every text from a trial is escaped before it reaches a chart's hover text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from autotune.figures.metrics import KL_DIVERGENCE, METRICS, PEAK_MEMORY_BYTES, THROUGHPUT, TTFT, Metric
from autotune.report.data import ReportData
from autotune.report.exploration import Progress
from autotune.study import TrialRecord
from autotune.traffic.shape import TrafficShape
from autotune.units import format_bytes, format_duration


def _knob_text(record: TrialRecord) -> str:
    return "<br>".join(f"{escape(str(k))}={escape(str(v))}" for k, v in record.config.items())


def _hover(record: TrialRecord) -> str:
    m = record.metrics
    roles = f" ({escape(', '.join(record.roles))})" if record.roles else ""
    return (
        f"<b>trial #{record.number}</b>{roles}<br>{_knob_text(record)}<br>"
        f"{m[THROUGHPUT.name]:.1f} tok/s · ttft {m.get(TTFT.name, math.nan) * 1000:.1f} ms<br>"
        f"memory {format_bytes(m.get(PEAK_MEMORY_BYTES))} · KL {m[KL_DIVERGENCE.name]:.2e}"
    )


def front_chart(
    complete: list[TrialRecord], front: set[int], data: ReportData, objectives: Sequence[Metric]
) -> go.Figure:
    """The first objective against the second (or the first alone), coloured by the third where there is one."""
    y_metric = objectives[0]
    x_metric = objectives[1] if len(objectives) > 1 else None
    colour = objectives[2] if len(objectives) > 2 else None
    chart = go.Figure()
    for on_front in (False, True):
        records = [r for r in complete if (r.number in front) == on_front]
        if not records:
            continue
        chart.add_trace(
            go.Scatter(
                x=[_x_value(r, x_metric) for r in records],
                y=[_shown(r, y_metric) for r in records],
                mode="markers",
                name="Pareto front" if on_front else "other trials",
                marker=_front_marker(complete, records, colour, on_front),
                hovertext=[_hover(r) for r in records],
                hoverinfo="text",
            )
        )
    for record, label, symbol in ((data.baseline, "baseline", "star"), (data.reference, "reference", "diamond")):
        if record is not None:
            chart.add_trace(_anchor_trace(record, label, symbol, x_metric, y_metric))
    against = f" vs {x_metric.heading}" if x_metric else ", trial by trial"
    coloured = f" (colour: {colour.label})" if colour else ""
    chart.update_layout(
        title=f"{y_metric.heading.capitalize()}{against}{coloured}{_at_capacity(data)}",
        xaxis={"title": _axis_title(x_metric) if x_metric else "trial", "type": _axis_type(x_metric)},
        yaxis={"title": _axis_title(y_metric), "type": _axis_type(y_metric)},
        height=520,
        legend={"orientation": "h", "y": -0.2},
    )
    return chart


def _front_marker(
    complete: list[TrialRecord], records: list[TrialRecord], colour: Metric | None, on_front: bool
) -> dict:
    """The markers of the front or of the other trials, coloured by the third objective where there is one."""
    marker: dict = {"size": 14 if on_front else 9, "line": {"width": 2 if on_front else 0, "color": "#d62728"}}
    if colour is None:
        return marker
    shown = [colour.on_scale(r.metrics[colour.name]) for r in complete]
    return marker | {
        "color": [colour.on_scale(r.metrics[colour.name]) for r in records],
        "colorscale": "Viridis",
        "cmin": math.log10(colour.log_floor) if colour.log_floor else min(shown),
        "cmax": max(shown) + 1e-9,
        "colorbar": {"title": colour.axis_title} if on_front else None,
        "showscale": on_front,
    }


def _anchor_trace(
    record: TrialRecord, label: str, symbol: str, x_metric: Metric | None, y_metric: Metric
) -> go.Scatter:
    """The baseline or the reference, marked and named."""
    return go.Scatter(
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


def _at_capacity(data: ReportData) -> str:
    """Where trials probed capacities, the SLO their figures hold within, and what those with none show."""
    if not data.capacities:
        return ""
    none = any(found.size is None for found in data.capacities.values())
    return f"<br>at each one's capacity {escape(data.terms.target.within)}" + (
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
    chart = go.Figure(
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
            chart.add_trace(
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
    chart.update_layout(
        title=f"{title} (red: Pareto front){_at_capacity(data)}",
        scene=scene,
        height=600,
        margin={"l": 0, "r": 0, "b": 0, "t": 60},
    )
    return chart


def _shown(record: TrialRecord, metric: Metric) -> float:
    """The figure as a 3-D axis shows it: above its floor where the axis is logarithmic."""
    value = record.metrics[metric.name]
    return max(value, metric.log_floor) if metric.log_floor else value


def importance_chart(by_objective: dict[str, dict[str, float]]) -> go.Figure:
    knobs = sorted({knob for shares in by_objective.values() for knob in shares})
    chart = go.Figure()
    for objective, shares in by_objective.items():
        label = METRICS[objective].heading
        chart.add_trace(
            go.Bar(
                y=knobs,
                x=[shares.get(knob, 0.0) for knob in knobs],
                orientation="h",
                name=label,
                hovertemplate="%{y}: %{x:.0%}<extra>" + escape(label) + "</extra>",
            )
        )
    chart.update_layout(
        title="How much each knob matters, per objective (Optuna PED-ANOVA importance)",
        barmode="group",
        xaxis={"title": "share of importance", "tickformat": ".0%"},
        height=160 + 60 * len(knobs),
        legend={"orientation": "h", "y": -0.25},
    )
    return chart


def parallel_chart(data: ReportData) -> go.Figure:
    assert data.parallel is not None
    dimensions = []
    for axis in data.parallel.axes:
        dimension: dict = {"label": axis.label, "values": axis.values}
        if axis.ticks is not None:
            dimension |= {"tickvals": list(range(len(axis.ticks))), "ticktext": [str(t) for t in axis.ticks]}
            dimension["range"] = [-0.3, len(axis.ticks) - 0.7]
        dimensions.append(dimension)
    chart = go.Figure(
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
    chart.update_layout(
        title=f"All {len(data.parallel.numbers)} complete trials: knobs and objectives (colour: throughput)",
        height=480,
        margin={"l": 80, "r": 80, "t": 90},
    )
    return chart


def progress_chart(progress: Progress) -> go.Figure:
    """The hypervolume of the front and the best figures so far, trial by trial."""
    labels = [f"#{n}" for n in progress.numbers]
    spent = zip(progress.numbers, progress.trial_time_s, strict=True)
    hover = [f"after trial #{n}, {format_duration(t)} in trials" for n, t in spent]
    chart = go.Figure()
    chart.add_trace(
        go.Scatter(
            x=labels,
            y=progress.hypervolume,
            name="hypervolume (share of final)",
            mode="lines+markers",
            line={"shape": "hv"},
            hovertext=hover,
        )
    )
    chart.add_trace(
        go.Scatter(
            x=labels,
            y=progress.best_throughput,
            name="best throughput so far (tok/s)",
            mode="lines",
            line={"shape": "hv", "dash": "dot"},
            yaxis="y2",
        )
    )
    chart.add_trace(
        go.Scatter(
            x=labels,
            y=progress.best_memory,
            name="lowest peak memory so far (GB)",
            mode="lines",
            line={"shape": "hv", "dash": "dash"},
            yaxis="y3",
        )
    )
    chart.update_layout(**PROGRESS_LAYOUT)
    return chart


PROGRESS_LAYOUT = {
    "title": "Hypervolume of the front and best-so-far, trial by trial",
    "xaxis": {"title": "launched trials, in order", "type": "category", "domain": [0, 0.86]},
    "yaxis": {"title": "hypervolume", "tickformat": ".0%", "range": [0, 1.05]},
    "yaxis2": {"title": "tok/s", "overlaying": "y", "side": "right", "showgrid": False, "rangemode": "tozero"},
    "yaxis3": {
        "title": "GB",
        "overlaying": "y",
        "side": "right",
        "position": 0.96,
        "anchor": "free",
        "showgrid": False,
        "rangemode": "tozero",
    },
    "height": 420,
    "legend": {"orientation": "h", "y": -0.3},
}


def traffic_chart(shape: TrafficShape) -> go.Figure:
    """The replayed requests: how long their inputs and outputs are (tokens, histograms), and when they arrive
    (requests arrived so far against seconds, where the trace has arrivals)."""
    timed = shape.arrivals_s is not None
    titles = ["input tokens per request", "output tokens per request"] + (["arrivals"] if timed else [])
    chart = make_subplots(rows=1, cols=len(titles), subplot_titles=titles)
    chart.add_trace(go.Histogram(x=list(shape.input_lens), name="input tokens", nbinsx=30), row=1, col=1)
    chart.add_trace(go.Histogram(x=list(shape.output_lens), name="output tokens", nbinsx=30), row=1, col=2)
    if shape.arrivals_s is not None:
        arrived = list(range(1, shape.requests + 1))
        line = {"shape": "hv"}
        chart.add_trace(go.Scatter(x=list(shape.arrivals_s), y=arrived, name="arrived", line=line), row=1, col=3)
        chart.update_xaxes(title_text="seconds from the first request", row=1, col=3)
        chart.update_yaxes(title_text="requests arrived", row=1, col=3)
    for column in (1, 2):
        chart.update_xaxes(title_text="tokens", row=1, col=column)
        chart.update_yaxes(title_text="requests", row=1, col=column)
    chart.update_layout(showlegend=False, height=340, title=f"The {shape.requests} requests each trial replays")
    return chart
