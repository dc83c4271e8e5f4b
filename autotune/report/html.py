"""Lay out the report as one self-contained HTML page (plotly.js inlined once, no network needed); the charts
themselves are drawn by autotune/report/charts.py.

Every text that comes from a model, a prompt, an error or the user is escaped before it reaches the
page: nothing from a trial can add markup or script.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from autotune.figures.constraints import Constraint
from autotune.figures.metrics import REPORT, Metric, shown_in
from autotune.report.capacity_chart import capacity_chart
from autotune.report.cards import card_facts
from autotune.report.ceiling import ceiling_section
from autotune.report.charts import (
    front_chart,
    importance_chart,
    parallel_chart,
    progress_chart,
    three_d_chart,
    traffic_chart,
)
from autotune.report.data import FailureGroup, ParetoCard, ReportData
from autotune.report.pages import write_page
from autotune.study import TrialRecord
from autotune.units import format_duration
from autotune.workloads import DetailsTable, describe_workload


def write_report(data: ReportData, path: Path) -> Path:
    again = f"the study is untouched: `autotune report --study {data.study_name}` writes the report again from it"
    return write_page(render(data), path, again)


def render(data: ReportData) -> str:
    traffic = [_section("Traffic", _traffic(data), "traffic")] if data.settings.workload.traffic else []
    sections = [
        _header(data),
        *traffic,
        _section("Pareto front", _front_charts(data), "front"),
        _section("Configurations to deploy", _cards(data), "cards"),
        _section("Decode ceiling", ceiling_section(data.ceilings), "ceiling") if data.ceilings else "",
        _section("What matters", _importance_charts(data), "knobs"),
        _section("Progress of the search", _progress_chart(data), "progress"),
        _section("Failures", _failures(data), "failures"),
        _section("All trials", _trials_table(data), "trials"),
        _section("Environment and budget", _environment(data), "environment"),
    ]
    return _PAGE.format(
        title=escape(f"autotune: {data.study_name}"),
        plotly=get_plotlyjs(),
        body="\n".join(sections),
    )


def _section(title: str, body: str, anchor: str) -> str:
    return f'<section id="{anchor}"><h2>{escape(title)}</h2>{body}</section>'


def _header(data: ReportData) -> str:
    settings = data.settings
    counts = ", ".join(f"{count} {escape(outcome)}" for outcome, count in sorted(data.outcomes.items()))
    return (
        f"<header><h1>{escape(data.study_name)}</h1>"
        f"<p>Model <b>{escape(settings.model)}</b> on profile <b>{escape(settings.profile.name)}</b> "
        f"({escape(settings.profile.description)}); workload: {escape(describe_workload(settings.workload))}.</p>"
        f"<p>{len(data.trials)} trials ({counts or 'none'}), {len(data.skipped)} sampled configurations skipped "
        f"before launch; {len(data.pareto)} on the Pareto front. Storage: <code>{escape(data.storage_url)}</code>. "
        f"Generated {escape(data.generated_at)}.</p>{_constraints_line(data)}</header>"
    )


def _constraints_line(data: ReportData) -> str:
    if not data.constraints:
        return ""
    items = ", ".join(f"<code>{escape(_constraint_label(c, data))}</code>" for c in data.constraints)
    infeasible = len(data.infeasible)
    return (
        f"<p class='constraints'>Searched under {items}: the front holds feasible trials only; "
        f"{infeasible} complete trial{'s' if infeasible != 1 else ''} broke a constraint.</p>"
    )


def _constraint_label(constraint: Constraint, data: ReportData) -> str:
    return data.constraint_label(constraint)


# -------------------------------------------------------------------------------------------- plots


def _front_charts(data: ReportData) -> str:
    complete = data.complete
    if not complete:
        return "<p>No trial completed yet, so there is no front to draw.</p>"
    front, objectives = set(data.pareto), data.settings.objective_metrics
    html = _chart_html(front_chart(complete, front, data, objectives), "fig-front")
    if len(objectives) >= 3:
        html += _chart_html(three_d_chart(complete, front, data, objectives), "fig-front-3d")
    return html


def _traffic(data: ReportData) -> str:
    """Which trace the study was tuned on, and its requests as the model's tokenizer counts them (charts)."""
    workload = data.settings.workload
    assert workload.traffic is not None
    shape = data.settings.prepared.traffic
    said = f"<p>Tuned on {escape(workload.traffic.describe())}"
    if shape is None:
        return said + ": no trial of this study has prepared them yet.</p>"
    return said + f": {escape(shape.describe())}.</p>" + _chart_html(traffic_chart(shape), "fig-traffic")


def _chart_html(chart: go.Figure, div_id: str) -> str:
    return chart.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False})


# -------------------------------------------------------------------------------------------- cards


def _cards(data: ReportData) -> str:
    if not data.cards:
        return f"<p>No configuration is on the front: {escape(data.empty_front_reason())}.</p>"
    return "".join(_card(card, index) for index, card in enumerate(data.cards))


def _card(card: ParetoCard, index: int) -> str:
    record = card.record
    facts = card_facts(card)
    roles = f" <span class='role'>{escape(', '.join(record.roles))}</span>" if record.roles else ""
    snippets = "".join(
        _snippet(f"{kind}-{index}", label, text, is_open)
        for kind, label, text, is_open in (
            ("py", "Python: from_pretrained + generate", card.python, True),
            ("serve", "transformers serve", card.serve, True),
            ("json", "JSON (configuration and keyword arguments)", card.json, False),
        )
    )
    knobs = ", ".join(f"{escape(str(k))}={escape(str(v))}" for k, v in record.config.items())
    curve = _chart_html(capacity_chart(card.curve), f"fig-capacity-{record.number}") if card.curve else ""
    return (
        f"<article class='card'><h3>Trial #{record.number}{roles}</h3><p class='knobs'>{knobs}</p>"
        f"<ul>{''.join(f'<li>{escape(fact)}</li>' for fact in facts)}</ul>{curve}"
        f"{details_table(record.details.table()) if record.details else ''}{snippets}</article>"
    )


def details_table(table: DetailsTable | None) -> str:
    """A kind's details as the card's table (serve: latency against load)."""
    if table is None:
        return ""
    header = "".join(f"<th>{escape(heading)}</th>" for heading in table.headings)
    rows = "".join("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in table.rows)
    return (
        f"<table class='{escape(table.css_class)}'><caption>{escape(table.caption)}</caption><tr>{header}</tr>"
        f"{rows}</table>"
    )


def _snippet(element_id: str, label: str, text: str, is_open: bool) -> str:
    return (
        f"<details class='snippet'{' open' if is_open else ''}><summary class='bar'>{escape(label)}"
        f"<button onclick=\"copyText('{element_id}', event)\">copy</button></summary>"
        f"<pre id='{element_id}'><code>{escape(text)}</code></pre></details>"
    )


# ---------------------------------------------------------------------------------- what matters


def _importance_charts(data: ReportData) -> str:
    parts = []
    importances = data.importances
    if importances is None or not importances.by_objective:
        parts.append(f"<p>Knob importances: {escape(importances.note if importances else 'not computed')}.</p>")
    else:
        parts.append(_chart_html(importance_chart(importances.by_objective), "fig-importance"))
        parts.append(f"<p class='note'>{escape(importances.note)}.</p>")
    if data.parallel is not None:
        parts.append(_chart_html(parallel_chart(data), "fig-parallel"))
    return "".join(parts)


# -------------------------------------------------------------------------------------- progress


def _progress_chart(data: ReportData) -> str:
    progress = data.progress
    if progress is None:
        return "<p>No trial has run yet.</p>"
    verdict = f"<p class='verdict'>{escape(progress.verdict)}</p>"
    return _chart_html(progress_chart(progress), "fig-progress") + verdict + _best_found(data)


def _best_found(data: ReportData) -> str:
    """When each objective's best figure was found: trial and minutes into its search run."""
    if not data.best:
        return ""
    rows = []
    for found in data.best:
        when = f"{found.minutes:.1f} min into search run {found.run}" if found.minutes is not None else "-"
        rows.append(
            f"<tr><td>{escape(found.metric.label)}</td><td>{found.value:.4g} {escape(found.metric.unit)}</td>"
            f"<td>#{found.number}</td><td>{when}</td></tr>"
        )
    head = "<tr><th>objective</th><th>best</th><th>found by trial</th><th>when</th></tr>"
    caption = "<caption>When the best of each objective was found</caption>"
    return f"<table id='best-found'>{caption}{head}{''.join(rows)}</table>"


# -------------------------------------------------------------------------------------- failures


def _failures(data: ReportData) -> str:
    if not data.failures:
        return "<p>No trial failed.</p>"
    return _values_taken_out(data) + "".join(_failure_group(group) for group in data.failures)


def _values_taken_out(data: ReportData) -> str:
    """Values excluded for the study (a typed refusal, or suspected in two configurations) and values suspected."""
    excluded = [
        f"<li><b>excluded</b>: {escape(reason)}</li>" for values in data.excluded.values() for reason in values.values()
    ]
    suspected = [
        f"<li><b>suspected</b>: {escape(knob)}={escape(value)} (trial #{found['trial']}: {escape(found['reason'])}); "
        "only the words of the error point at it, so it is tried again in another configuration</li>"
        for knob, values in data.suspected.items()
        for value, found in values.items()
    ]
    if not excluded and not suspected:
        return ""
    items = "".join(excluded + suspected)
    return f"<div class='taken-out'><h3>Knob values blamed for a failure</h3><ul>{items}</ul></div>"


def _failure_group(group: FailureGroup) -> str:
    items = []
    for record in group.trials:
        where = f" in {escape(record.phase)}" if record.phase else ""
        log = (
            f"<details><summary>log tail</summary><pre class='log'>{escape(record.log_tail)}</pre></details>"
            if record.log_tail
            else ""
        )
        items.append(
            f"<li><b>#{record.number}</b>{where}: <span class='knobs'>{escape(_config_text(record))}</span>"
            f"{_blame(record)}<pre class='error'>{escape(record.message or '(no message)')}</pre>{log}</li>"
        )
    count = len(group.trials)
    return (
        f"<div class='failure-group' data-outcome='{escape(group.outcome)}'><h3>{escape(group.outcome)}: "
        f"{count} trial{'s' if count != 1 else ''}</h3><p>{escape(group.meaning)}</p><ul>{''.join(items)}</ul></div>"
    )


def _blame(record: TrialRecord) -> str:
    """Which value the failure points at, and whether that is certain (a typed refusal) or a suspicion."""
    if record.blame is None:
        return ""
    named = f"{record.blame.knob}={record.blame.value}"
    how = "refused (excluded for the study)" if record.blame.certain else "suspected from the error's words"
    return f" <span class='blame'>{escape(named)}: {how}</span>"


# ------------------------------------------------------------------------------------------- tables


_COLUMNS = ("#", "why it ran", "outcome", "configuration")


def _trials_table(data: ReportData) -> str:
    front = set(data.pareto)
    figures = shown_in(REPORT, [record.metrics for record in data.trials])
    rows = "".join(_trial_row(data, record, record.number in front, figures) for record in data.trials)
    columns = [*_COLUMNS, *(metric.column_heading for metric in figures), "time", "details"]
    if data.capacities:  # before the time: a figure, as the others
        columns.insert(-2, f"capacity {data.terms.target.within}")
    head = "".join(f"<th>{escape(column)}</th>" for column in columns)
    skipped = "".join(
        f"<li>#{r.number} {escape(_config_text(r))}: {escape(r.skipped or '')}</li>" for r in data.skipped
    )
    skipped_html = (
        f"<details><summary>{len(data.skipped)} sampled configurations were skipped before launch</summary>"
        f"<ul>{skipped}</ul></details>"
        if data.skipped
        else ""
    )
    return (
        f"<p>{escape(WHY_IT_RAN)}</p>"
        f"<table class='trials'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>{skipped_html}"
    )


WHY_IT_RAN = (
    "Why each trial ran: reference and baseline come first; warm-start re-measures an earlier study's "
    "front; warm-up trials change one knob of the baseline, for each value of each knob, cheapest first; "
    "composed trials combine the warm-up changes that served one trade-off; predicted trials make a "
    "one-knob change to a Pareto configuration that the warm-up predicts would extend the front; "
    "then the sampler (Optuna's multivariate TPE) proposes; retry re-runs a trial whose process died. "
    "Proposals that a rule forbids, that an earlier out-of-memory failure rules out, or that were "
    "measured already are skipped without running (listed below the table)."
)


def _config_text(record: TrialRecord) -> str:
    return ", ".join(f"{k}={v}" for k, v in record.config.items())


def _trial_row(data: ReportData, record: TrialRecord, on_front: bool, figures: Sequence[Metric]) -> str:
    m = record.metrics
    found = data.capacities.get(record.number)
    cells = [
        f"{record.number}{' ★' if on_front else ''}",
        ", ".join(record.roles),
        record.outcome or "",
        _config_text(record),
        *(metric.text(m) for metric in figures),
        format_duration(record.duration_s) if record.duration_s else "-",
    ]
    if data.capacities:
        cells.insert(-1, ("none" if found.size is None else found.unit.size_text(found.size)) if found else "-")
    details = f"{record.phase or ''}: {record.message}" if record.message else ""
    details = data.infeasible_reason(record) or details
    html_cells = "".join(f"<td>{escape(cell)}</td>" for cell in cells)
    outcome_class = escape(record.outcome or "running")
    return f"<tr class='{outcome_class}'>{html_cells}<td class='details'>{escape(details)}</td></tr>"


def _environment(data: ReportData) -> str:
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in data.environment.items())
    return f"<table class='env'>{body}</table>"


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }}
h1 {{ margin-bottom: 0.2em; }} section {{ margin-top: 2em; }}
table {{ border-collapse: collapse; width: 100%; font-size: 0.85em; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 4px 6px; text-align: left; vertical-align: top; }}
table.trials tr.ok td:nth-child(3) {{ color: #2a7d2a; }}
table.trials tr:not(.ok) td:nth-child(3) {{ color: #b02a2a; font-weight: bold; }}
td.details {{ max-width: 28em; white-space: pre-wrap; word-break: break-word; font-family: monospace; }}
.card {{ border: 1px solid #ccc; border-radius: 6px; padding: 0.8em 1.2em; margin: 1em 0; }}
.knobs {{ font-family: monospace; }} .role {{ background: #eef; border-radius: 4px; padding: 0 6px; font-size: 0.8em; }}
.snippet pre {{ background: #f6f8fa; padding: 0.8em; overflow-x: auto; margin: 0 0 0.8em 0; }}
.snippet .bar {{ font-size: 0.85em; color: #555; cursor: pointer; margin: 0.3em 0; }}
.snippet .bar button {{ float: right; }}
pre.error, pre.log {{ background: #fff4f4; padding: 0.5em; white-space: pre-wrap; word-break: break-word;
  max-height: 16em; overflow-y: auto; }}
.failure-group h3 {{ color: #b02a2a; margin-bottom: 0.2em; }} .note, .verdict {{ color: #444; }}
.verdict {{ font-weight: bold; }} .constraints {{ background: #fffbe6; padding: 0.4em; }}
</style>
<script type="text/javascript">{plotly}</script>
<script>
function copyText(id, event) {{
  event.preventDefault();  // the button sits in a <summary>: copy without folding the snippet
  navigator.clipboard.writeText(document.getElementById(id).innerText);
}}
</script>
</head><body>
{body}
</body></html>
"""
