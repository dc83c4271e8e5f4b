"""Render the report as one self-contained HTML page (plotly.js inlined once, no network needed).

Every text that comes from a model, a prompt, an error or the user is escaped before it reaches the
page: nothing from a trial can add markup or script.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from autotune.metrics import KL_DIVERGENCE, PEAK_MEMORY, THROUGHPUT
from autotune.report.data import ParetoCard, ReportData
from autotune.study import TrialRecord
from autotune.units import format_bytes, format_duration

KL_FLOOR = 1e-6  # the reference's KL is 0; colours use log10(max(KL, floor))


def write_report(data: ReportData, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(render(data), encoding="utf-8")
    staging.replace(path)
    return path


def render(data: ReportData) -> str:
    sections = [
        _header(data),
        _section("Pareto front", _front_figures(data), "front"),
        _section("Configurations to deploy", _cards(data), "cards"),
        _section("All trials", _trials_table(data), "trials"),
        _section("Environment", _environment(data), "environment"),
    ]
    return _PAGE.format(
        title=escape(f"autotune: {data.study_name}"),
        plotly=get_plotlyjs(),
        body="\n".join(sections),
    )


def _section(title: str, body: str, anchor: str) -> str:
    return f'<section id="{anchor}"><h2>{escape(title)}</h2>{body}</section>'


def _header(data: ReportData) -> str:
    settings, workload = data.settings, data.settings.workload
    counts = ", ".join(f"{count} {escape(outcome)}" for outcome, count in sorted(data.outcomes.items()))
    return (
        f"<header><h1>{escape(data.study_name)}</h1>"
        f"<p>Model <b>{escape(settings.model)}</b> on profile <b>{escape(settings.profile['name'])}</b> "
        f"({escape(settings.profile['description'])}); workload: batch {workload['batch_size']}, "
        f"{workload['input_len']} tokens in, {workload['output_len']} out.</p>"
        f"<p>{len(data.trials)} trials ({counts or 'none'}), {len(data.skipped)} sampled configurations skipped "
        f"before launch; {len(data.pareto)} on the Pareto front. Storage: <code>{escape(data.storage)}</code>. "
        f"Generated {escape(data.generated_at)}.</p></header>"
    )


# -------------------------------------------------------------------------------------------- plots


def _knob_text(record: TrialRecord) -> str:
    return "<br>".join(f"{escape(str(k))}={escape(str(v))}" for k, v in record.config.items())


def _hover(record: TrialRecord) -> str:
    m = record.metrics
    roles = f" ({escape(', '.join(record.roles))})" if set(record.roles) - {"search"} else ""
    return (
        f"<b>trial #{record.number}</b>{roles}<br>{_knob_text(record)}<br>"
        f"{m[THROUGHPUT.name]:.1f} tok/s · ttft {m.get('ttft_s', math.nan) * 1000:.1f} ms<br>"
        f"memory {format_bytes(m.get('peak_memory_bytes'))} · KL {m[KL_DIVERGENCE.name]:.2e}"
    )


def _front_figures(data: ReportData) -> str:
    complete = data.complete
    if not complete:
        return "<p>No trial completed yet, so there is no front to draw.</p>"
    front = set(data.pareto)
    return _figure_html(_speed_memory_figure(complete, front, data), "fig-front") + _figure_html(
        _three_d_figure(complete, front), "fig-front-3d"
    )


def _speed_memory_figure(complete: list[TrialRecord], front: set[int], data: ReportData) -> go.Figure:
    figure = go.Figure()
    for on_front in (False, True):
        records = [r for r in complete if (r.number in front) == on_front]
        if not records:
            continue
        figure.add_trace(
            go.Scatter(
                x=[r.metrics[PEAK_MEMORY.name] for r in records],
                y=[r.metrics[THROUGHPUT.name] for r in records],
                mode="markers",
                name="Pareto front" if on_front else "other trials",
                marker={
                    "size": 14 if on_front else 9,
                    "color": [math.log10(max(r.metrics[KL_DIVERGENCE.name], KL_FLOOR)) for r in records],
                    "colorscale": "Viridis",
                    "cmin": math.log10(KL_FLOOR),
                    "cmax": max(math.log10(max(r.metrics[KL_DIVERGENCE.name], KL_FLOOR)) for r in complete) + 1e-9,
                    "colorbar": {"title": "log10 KL"} if on_front else None,
                    "showscale": on_front,
                    "line": {"width": 2 if on_front else 0, "color": "#d62728"},
                },
                hovertext=[_hover(r) for r in records],
                hoverinfo="text",
            )
        )
    for record, label, symbol in ((data.baseline, "baseline", "star"), (data.reference, "reference", "diamond")):
        if record is not None:
            figure.add_trace(
                go.Scatter(
                    x=[record.metrics[PEAK_MEMORY.name]],
                    y=[record.metrics[THROUGHPUT.name]],
                    mode="markers+text",
                    text=[label],
                    textposition="top center",
                    name=label,
                    marker={"symbol": symbol, "size": 18, "color": "rgba(0,0,0,0)", "line": {"width": 2}},
                    hovertext=[_hover(record)],
                    hoverinfo="text",
                )
            )
    figure.update_layout(
        title="Speed vs memory (colour: KL divergence from the reference)",
        xaxis_title="peak memory (GB)",
        yaxis_title="decode throughput (tokens/s)",
        height=520,
        legend={"orientation": "h", "y": -0.2},
    )
    return figure


def _three_d_figure(complete: list[TrialRecord], front: set[int]) -> go.Figure:
    figure = go.Figure(
        go.Scatter3d(
            x=[r.metrics[PEAK_MEMORY.name] for r in complete],
            y=[r.metrics[THROUGHPUT.name] for r in complete],
            z=[max(r.metrics[KL_DIVERGENCE.name], KL_FLOOR) for r in complete],
            mode="markers",
            marker={
                "size": [8 if r.number in front else 4 for r in complete],
                "color": ["#d62728" if r.number in front else "#7f7f7f" for r in complete],
            },
            hovertext=[_hover(r) for r in complete],
            hoverinfo="text",
        )
    )
    figure.update_layout(
        title="All three objectives (red: Pareto front)",
        scene={"xaxis_title": "memory (GB)", "yaxis_title": "tokens/s", "zaxis_title": "KL", "zaxis_type": "log"},
        height=560,
    )
    return figure


def _figure_html(figure: go.Figure, div_id: str) -> str:
    return figure.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False})


# -------------------------------------------------------------------------------------------- cards


def _cards(data: ReportData) -> str:
    if not data.cards:
        return "<p>No configuration is on the front yet.</p>"
    return "".join(_card(card, index) for index, card in enumerate(data.cards))


def _card(card: ParetoCard, index: int) -> str:
    record, m = card.record, card.record.metrics
    facts = [f"{m[THROUGHPUT.name]:.1f} tok/s"]
    if card.speedup is not None:
        facts.append(f"{card.speedup:.2f}× the baseline's throughput")
    facts.append(f"peak memory {format_bytes(m.get('peak_memory_bytes'))}")
    if card.memory_saving is not None:
        facts.append(f"{card.memory_saving * 100:+.0f}% memory saved vs baseline")
    facts.append(f"KL {m[KL_DIVERGENCE.name]:.2e}, top-1 agreement {m.get('top1_agreement', math.nan) * 100:.1f}%")
    facts.append(f"ttft {m.get('ttft_s', math.nan) * 1000:.1f} ms, {m.get('tpot_s', math.nan) * 1000:.2f} ms/token")
    roles = f" <span class='role'>{escape(', '.join(record.roles))}</span>" if set(record.roles) - {"search"} else ""
    snippets = "".join(
        _snippet(f"{kind}-{index}", label, text)
        for kind, label, text in (
            ("py", "Python", card.python),
            ("serve", "transformers serve", card.serve),
            ("json", "JSON", card.json),
        )
    )
    knobs = ", ".join(f"{escape(str(k))}={escape(str(v))}" for k, v in record.config.items())
    return (
        f"<article class='card'><h3>Trial #{record.number}{roles}</h3><p class='knobs'>{knobs}</p>"
        f"<ul>{''.join(f'<li>{escape(fact)}</li>' for fact in facts)}</ul>{snippets}</article>"
    )


def _snippet(element_id: str, label: str, text: str) -> str:
    return (
        f"<div class='snippet'><div class='bar'>{escape(label)}"
        f"<button onclick=\"copyText('{element_id}')\">copy</button></div>"
        f"<pre id='{element_id}'><code>{escape(text)}</code></pre></div>"
    )


# ------------------------------------------------------------------------------------------- tables


_COLUMNS = (
    "#",
    "role",
    "outcome",
    "configuration",
    "tok/s",
    "ttft",
    "ms/token",
    "memory",
    "KL",
    "top-1",
    "ppl",
    "time",
    "details",
)


def _trials_table(data: ReportData) -> str:
    front = set(data.pareto)
    rows = "".join(_trial_row(record, record.number in front) for record in data.trials)
    head = "".join(f"<th>{escape(column)}</th>" for column in _COLUMNS)
    skipped = "".join(
        f"<li>#{r.number} {escape(_config_text(r))}: {escape(r.skipped or '')}</li>" for r in data.skipped
    )
    skipped_html = (
        f"<details><summary>{len(data.skipped)} sampled configurations were skipped before launch</summary>"
        f"<ul>{skipped}</ul></details>"
        if data.skipped
        else ""
    )
    return f"<table class='trials'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>{skipped_html}"


def _config_text(record: TrialRecord) -> str:
    return ", ".join(f"{k}={v}" for k, v in record.config.items())


def _trial_row(record: TrialRecord, on_front: bool) -> str:
    m = record.metrics
    cells = [
        f"{record.number}{' ★' if on_front else ''}",
        ", ".join(role for role in record.roles if role != "search"),
        record.outcome or "",
        _config_text(record),
        _number(m.get(THROUGHPUT.name), "{:.1f}"),
        _number(m.get("ttft_s"), "{:.1f} ms", 1000),
        _number(m.get("tpot_s"), "{:.2f}", 1000),
        format_bytes(m.get("peak_memory_bytes")) if m else "-",
        _number(m.get(KL_DIVERGENCE.name), "{:.2e}"),
        _number(m.get("top1_agreement"), "{:.1f}%", 100),
        _number(m.get("perplexity"), "{:.2f}"),
        format_duration(record.duration_s) if record.duration_s else "-",
    ]
    details = f"{record.phase or ''}: {record.message}" if record.message else ""
    html_cells = "".join(f"<td>{escape(cell)}</td>" for cell in cells)
    outcome_class = escape(record.outcome or "running")
    return f"<tr class='{outcome_class}'>{html_cells}<td class='details'>{escape(details)}</td></tr>"


def _number(value: float | None, template: str, scale: float = 1.0) -> str:
    return "-" if value is None else template.format(value * scale)


def _environment(data: ReportData) -> str:
    extra = data.settings.extra
    rows = {
        "device": extra.get("device"),
        "profile": f"{data.settings.profile['name']}: {data.settings.profile['description']}",
        **{key: value for key, value in (extra.get("environment") or {}).items()},
        "model parameters": (extra.get("model_info") or {}).get("parameters"),
        "reference configuration": extra.get("reference", {}).get("config"),
        "baseline configuration": extra.get("baseline", {}).get("config"),
    }
    if extra.get("hardware_note"):
        rows["note"] = extra["hardware_note"]
    body = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>" for k, v in rows.items())
    return f"<table class='env'>{body}</table>"


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }}
h1 {{ margin-bottom: 0.2em; }} section {{ margin-top: 2em; }}
table {{ border-collapse: collapse; width: 100%; font-size: 0.85em; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 4px 6px; text-align: left; vertical-align: top; }}
tr.ok td:nth-child(3) {{ color: #2a7d2a; }} tr:not(.ok) td:nth-child(3) {{ color: #b02a2a; font-weight: bold; }}
td.details {{ max-width: 28em; white-space: pre-wrap; word-break: break-word; font-family: monospace; }}
.card {{ border: 1px solid #ccc; border-radius: 6px; padding: 0.8em 1.2em; margin: 1em 0; }}
.knobs {{ font-family: monospace; }} .role {{ background: #eef; border-radius: 4px; padding: 0 6px; font-size: 0.8em; }}
.snippet pre {{ background: #f6f8fa; padding: 0.8em; overflow-x: auto; margin: 0 0 0.8em 0; }}
.snippet .bar {{ font-size: 0.8em; color: #555; display: flex; justify-content: space-between; }}
</style>
<script type="text/javascript">{plotly}</script>
<script>
function copyText(id) {{ navigator.clipboard.writeText(document.getElementById(id).innerText); }}
</script>
</head><body>
{body}
</body></html>
"""
