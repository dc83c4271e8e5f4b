"""What `best`, `compare` and `history` print: a stored study's pick, two studies compared, nights side by side, each
as a table, Markdown (a CI job's summary page) or one JSON document. Nothing here decides anything."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from autotune.cli.printers import knobs_line, out
from autotune.figures.constraints import MEETS_SLO, Constraint
from autotune.figures.metrics import COLUMN, METRICS, WHERE_MEASURED, Metric, compared, in_history
from autotune.figures.task import ALPHA
from autotune.units import format_bytes

if TYPE_CHECKING:
    from pathlib import Path

    from autotune.analysis.capacity import AtCapacity
    from autotune.analysis.compare import Comparison, Level, Tolerances
    from autotune.analysis.history import FrontPoint, History
    from autotune.analysis.task_changes import TaskChange
    from autotune.report.best import Best
    from autotune.report.cards import DeployCard


# ------------------------------------------------------------------------------------ compare


def _moved_columns(comparison: Comparison) -> dict[str, str]:
    """The figures whose change the table shows (each metric says whether it has a column), some only where either
    study measured them (capacity, where either probed one)."""
    return {
        metric.name: metric.column_heading
        for metric in compared()
        if metric.compared == COLUMN or (metric.compared == WHERE_MEASURED and _measured(comparison, metric.name))
    }


def _measured(comparison: Comparison, name: str) -> bool:
    return any(name in (m.before or {}) or name in (m.after or {}) for m in comparison.movements)


def print_comparison(study_a: str, study_b: str, comparison: Comparison, output: str = "table") -> None:
    """As a table (default), one JSON document, or Markdown (a CI job's summary page)."""
    if output == "json":
        print(json.dumps(_comparison_document(study_a, study_b, comparison)))
        return
    if output == "markdown":
        print(comparison_markdown(study_a, study_b, comparison))
        return
    columns = _moved_columns(comparison)
    table = Table(title=f"{study_a} -> {study_b}: figures of the configurations on either front{_within(comparison)}")
    for column in ("configuration", "front", *columns.values()):
        table.add_column(column)
    for movement in comparison.movements:
        changes = movement.change
        cells = [_change(changes, name) for name in columns]
        table.add_row(knobs_line(movement.config), "+".join(movement.on_front), *cells)
    out.print(table)
    t = comparison.tolerances
    out.print(
        f"tolerances: throughput -{t.throughput:.0%}, memory +{t.memory:.0%}, KL +{t.kl:.0%} "
        "(a level of the earlier front is met by a configuration within the memory and KL tolerances)"
    )
    if comparison.quality_apart:
        out.print(f"{comparison.quality_apart}; a level is met within the memory tolerance alone")
    if comparison.traffic_apart:
        out.print(f"compared across traffic (--across-traffic): {comparison.traffic_apart}")
    for level in comparison.levels:
        out.print(_level_line(study_b, level, t))
    _print_task(comparison)


def _within(comparison: Comparison) -> str:
    """Where the studies probed capacities: the SLO every figure of the comparison holds within."""
    target = comparison.target
    return f", at each one's capacity {target.within} (both studies)" if target else ""


def comparison_markdown(study_a: str, study_b: str, comparison: Comparison) -> str:
    t = comparison.tolerances
    regressed = comparison.regressed_figures()
    verdict = "**REGRESSED**: " + ", ".join(regressed) if regressed else "no regression"
    columns = _moved_columns(comparison)
    lines = [
        f"### autotune compare: {_md(study_a)} → {_md(study_b)}: {verdict}",
        "",
        f"Tolerances: throughput -{t.throughput:.0%}, memory +{t.memory:.0%}, KL +{t.kl:.0%}.",
        *([f"Figures at each configuration's capacity {_md(comparison.target.within)}."] if comparison.target else []),
        *([f"{_md(comparison.quality_apart)}."] if comparison.quality_apart else []),
        *([f"Compared across traffic: {_md(comparison.traffic_apart)}."] if comparison.traffic_apart else []),
        "",
        "| configuration | front | " + " | ".join(columns.values()) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for movement in comparison.movements:
        cells = [_change(movement.change, name) for name in columns]
        lines.append(f"| `{_md(knobs_line(movement.config))}` | {'+'.join(movement.on_front)} | {' | '.join(cells)} |")
    lines += ["", "Each level of the earlier front:", ""]
    lines += [f"- {_md(_level_line(study_b, level, t))}" for level in comparison.levels]
    return "\n".join([*lines, *_task_markdown(comparison)])


def _md(text: str) -> str:
    """Text inside a Markdown table or list: pipes escaped, no line breaks."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def _comparison_document(study_a: str, study_b: str, comparison: Comparison) -> dict[str, Any]:
    tolerances = comparison.tolerances
    return {
        "before": study_a,
        "after": study_b,
        "threshold": comparison.threshold,
        "tolerances": {"throughput": tolerances.throughput, "memory": tolerances.memory, "kl": tolerances.kl},
        "slo": comparison.target.slo if comparison.target else None,
        "within": comparison.target.within if comparison.target else None,
        "quality_apart": comparison.quality_apart,
        **({"traffic_apart": comparison.traffic_apart} if comparison.traffic_apart else {}),
        "regressed": comparison.regression,
        "configurations": [asdict(movement) for movement in comparison.movements],
        "levels": [
            {
                **asdict(level),
                "at_capacity_before": _capacity_json(level.at_capacity_before),
                "at_capacity_after": _capacity_json(level.at_capacity_after),
                "change": level.change(),
                "regression": level.regression(),
                "regressed_figure": level.regressed_figure(tolerances),
            }
            for level in comparison.levels
        ],
        **({"task": _task_json(comparison)} if comparison.task else {}),
    }


def _capacity_json(found: AtCapacity | None) -> dict[str, Any] | None:
    return found.to_json() if found is not None else None


def _level_line(study_b: str, level: Level, tolerances: Tolerances) -> str:
    """One level of the earlier front: what the later study gives there, in words whose signs match."""
    where = f"at {format_bytes(level.memory_gb * 1e9)} and KL {level.kl:.2e} ({knobs_line(level.config)})"
    figure = level.regressed_figure(tolerances)
    flag = f"REGRESSED {figure}" if figure else "ok"
    if level.best_after is not None:
        by = "" if level.config_after == level.config else f" with {knobs_line(level.config_after or {})}"
        return (
            f"{flag}: {where}: best throughput {level.throughput_before:.1f} -> {level.best_after:.1f} tok/s{by} "
            f"({level.change():+.1%}; a loss over {tolerances.throughput:.0%} regresses)"
            f"{_capacities(level.at_capacity_before, level.at_capacity_after)}"
        )
    miss = level.nearest_miss
    if miss is None:
        return f"{flag}: {where}: {study_b} has no complete trial"
    levels = {"memory": (miss.memory_gb, level.memory_gb, tolerances.memory), "KL": (miss.kl, level.kl, tolerances.kl)}
    bounds = "; ".join(
        f"its {name} is {share:+.1%} ({_shown(name, levels[name][0])} vs {_shown(name, levels[name][1])}, "
        f"tolerance +{levels[name][2]:.0%})"
        for name, share in miss.over.items()
    )
    speed = (miss.throughput - level.throughput_before) / level.throughput_before
    return (
        f"{flag}: {where}: no configuration of {study_b} is within its {' and '.join(miss.over)} tolerance; "
        f"the nearest, {knobs_line(miss.config)}, reaches {miss.throughput:.1f} tok/s ({speed:+.1%}) but {bounds}"
    )


def _capacities(before: AtCapacity | None, after: AtCapacity | None) -> str:
    """ "; at capacity within itl_p95<=6ms: batch 16 -> 32, 2055 -> 4100 generated tok/s end to end per GPU, ..."."""
    if before is None or after is None:
        return ""
    sizes = [before, after]
    said = " -> ".join(f.unit.size_text(f.size) if f.size is not None else "none" for f in sizes)
    per_device = " -> ".join(_per(f.tokens_per_s_per_device, "{:.4g}") for f in sizes)
    cost = " -> ".join(_per(f.cost_per_million_tokens, "${:.4g}") for f in sizes)
    return (
        f"; at capacity {after.target.within}: {said}, {per_device} generated tok/s end to end per {after.device}, "
        f"{cost} per 1M generated tokens"
    )


def _per(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def _shown(name: str, value: float) -> str:
    return format_bytes(value * 1e9) if name == "memory" else f"{value:.2e}"


def _change(changes: dict[str, float], name: str) -> str:
    return f"{changes[name]:+.1%}" if name in changes else "-"


# ------------------------------------------------------------------------------------ compare: on the task

TASK_HEADINGS = (
    "configuration",
    "items",
    "accuracy",
    "right then, wrong now / the reverse",
    "recovery vs the night before",
    "flips vs its reference",
    "newly flipped / no longer",
    "verdict",
)


def _task_sentence(comparison: Comparison) -> str:
    """What the task's rows say and when one regressed."""
    task, t = comparison.task, comparison.tolerances
    assert task is not None
    return (
        f"On the task ({task.task}), each configuration evaluated in both, its answers paired item by item: a "
        f"regression is a loss of accuracy over {t.accuracy:.0%} of the earlier's, or more items flipped by over "
        f"{t.flips:.0%} of them, beyond chance (exact one-sided sign test on the items that changed, p < {ALPHA:g})"
    )


def _task_cells(change: TaskChange, comparison: Comparison) -> list[str]:
    recovery = change.recovery
    low = f" (>={change.recovery_low:.1%})" if change.recovery_low is not None else ""
    regressed = change.regressed(comparison.tolerances)
    return [
        knobs_line(change.config),
        str(change.items),
        f"{change.accuracy_before:.1%} -> {change.accuracy_after:.1%}",
        f"{change.lost} / {change.gained} (p = {change.accuracy_p:.2g})",
        f"{recovery:.1%}{low}" if recovery is not None else "-",
        f"{change.flips_before:.1%} -> {change.flips_after:.1%}",
        f"{change.newly_flipped} / {change.unflipped} (p = {change.flips_p:.2g})",
        f"REGRESSED {', '.join(regressed)}" if regressed else "ok",
    ]


def _print_task(comparison: Comparison) -> None:
    task = comparison.task
    if task is None:
        return
    if task.apart:
        out.print(f"on the task: not compared, {task.apart}")
        return
    if not task.changes:
        out.print(f"on the task ({task.task}): no configuration on either front was evaluated in both")
        return
    table = Table(title=_task_sentence(comparison))
    for heading in TASK_HEADINGS:
        table.add_column(heading)
    for change in task.changes:
        table.add_row(*_task_cells(change, comparison))
    out.print(table)


def _task_markdown(comparison: Comparison) -> list[str]:
    task = comparison.task
    if task is None:
        return []
    if task.apart or not task.changes:
        why = f"not compared, {task.apart}" if task.apart else "no configuration on either front was evaluated in both"
        return ["", f"On the task: {_md(why)}."]
    rows = [f"| {' | '.join(_md(cell) for cell in _task_cells(change, comparison))} |" for change in task.changes]
    return ["", f"{_md(_task_sentence(comparison))}:", "", f"| {' | '.join(TASK_HEADINGS)} |",
            "|" + "---|" * len(TASK_HEADINGS), *rows]  # fmt: skip


def _task_json(comparison: Comparison) -> dict[str, Any]:
    """Where both studies were evaluated on a task: each configuration's answers paired, and what regressed."""
    task = comparison.task
    assert task is not None
    changes = [
        {
            **asdict(change),
            "recovery": change.recovery,
            "accuracy_p": change.accuracy_p,
            "flips_p": change.flips_p,
            "regressed": change.regressed(comparison.tolerances),
        }
        for change in task.changes
    ]
    t = comparison.tolerances
    return {
        "task": task.task,
        "apart": task.apart,
        "tolerances": {"accuracy": t.accuracy, "flips": t.flips, "alpha": ALPHA},
        "regressed": task.regressed(t),
        "configurations": changes,
    }


# ------------------------------------------------------------------------------------ history


def print_history(history: History, chart: Path, output: str = "table") -> None:
    """The nights as a table (default), Markdown (a CI job's summary page) or one JSON document."""
    from autotune.report.history_table import history_headings, night_cells

    headings = history_headings(history)
    rows = [night_cells(history, night) for night in history.nights]
    if output == "json":
        print(json.dumps(_history_document(history, str(chart))))
    elif output == "markdown":
        regressed = ", ".join(night.label for night in history.regressed) or "none"
        count = len(history.nights)
        print(f"### autotune history: {count} night{'s' if count != 1 else ''}, regressed: {_md(regressed)}\n")
        print("| " + " | ".join(headings) + " |")
        print("|" + "---|" * len(headings))
        for cells in rows:
            print("| " + " | ".join(_md(cell) for cell in cells) + " |")
    else:
        table = Table(title="Nights side by side (each compared with the night before, as autotune compare does)")
        for column in headings:
            table.add_column(column)
        for cells in rows:
            table.add_row(*cells)
        out.print(table)
        out.print(f"chart: {chart}")


def _history_document(history: History, chart: str) -> dict[str, Any]:
    return {
        "chart": chart,
        "nights": [
            {
                "study": night.study,
                "date": night.date,
                "launched": night.launched,
                "front": [_front_point(point, history) for point in night.points],
                "best_throughput_tok_s": night.best_throughput,
                "lowest_peak_memory_gb": night.lowest_memory_gb,
                "lowest_kl": night.lowest_kl,
                **{best_key(metric): night.best(metric) for metric in in_history() if history.shows(metric)},
                "slo": night.target.slo if night.target else None,
                "fastest_at_capacity": _capacity_json(night.fastest_capacity),
                "previous": night.previous,
                "regressed": night.regressed,
                "verdict": night.verdict(),
            }
            for night in history.nights
        ],
    }


def best_key(metric: Metric) -> str:
    """The key of a night's best of a figure in the JSON: best_<figure>, or lowest_<figure> for one minimised."""
    return f"{'best' if metric.direction == 'maximize' else 'lowest'}_{metric.name}"


def _front_point(point: FrontPoint, history: History) -> dict[str, Any]:
    shown = {key: value for key, value in asdict(point).items() if key != "figures"}
    figures = {
        name: value
        for name, value in point.figures.items()
        if history.shows(METRICS[name]) and (value is not None or not METRICS[name].optional)
    }
    return {**shown, "capacity": _capacity_json(point.capacity), **figures}


# ------------------------------------------------------------------------------------ best


def best_document(found: Best) -> dict[str, Any]:
    chosen, deploy = found.pick, found.card
    record = chosen.chosen
    assert record is not None
    return {
        "study": found.study,
        "trial": record.number,
        "goal": str(chosen.goal),
        "constraints": [str(c) for c in chosen.constraints],
        "complete_trials": chosen.considered,
        "feasible_trials": len(chosen.feasible),
        "on_front": chosen.on_front,
        "config": record.config,
        "metrics": record.metrics,
        "speedup_vs_baseline": deploy.speedup,
        "memory_saving_vs_baseline": deploy.memory_saving,
        "capacity": _capacity_json(deploy.at_capacity),  # its capacity and what it carries there, with its SLO
        "deploy": json.loads(deploy.json),
        "python": deploy.python,
        "serve": deploy.serve,
    }


def print_best(found: Best, output: str = "table") -> None:
    """The configuration picked as a table (default), one JSON document, Python code or a `transformers serve`
    command."""
    if output == "python":
        typer.echo(found.card.python, nl=False)
    elif output == "serve":
        typer.echo(found.card.serve)
    elif output == "json":
        typer.echo(json.dumps(best_document(found), indent=2))
    else:
        _print_best_table(found)


def _print_best_table(found: Best) -> None:
    from autotune.report.cards import card_facts

    chosen, deploy = found.pick, found.card
    record = chosen.chosen
    assert record is not None
    asked = ", ".join(_asked(c, deploy) for c in chosen.constraints) or "no constraints"
    out.print(
        f"study {found.study}: trial #{record.number} ({chosen.goal}; {asked}; "
        f"{len(chosen.feasible)} of {chosen.considered} complete trials satisfy them)"
    )
    table = Table(show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("configuration", knobs_line(record.config))
    for fact in card_facts(deploy):
        table.add_row("", fact)
    table.add_row("serve", deploy.serve)
    out.print(table)
    out.print("code: add --format python (or json, serve)")


def _asked(constraint: Constraint, deploy: DeployCard) -> str:
    """A constraint for people; the study's SLO as the capacity it asks for."""
    if constraint == MEETS_SLO and deploy.at_capacity is not None:
        return f"a capacity {deploy.at_capacity.target.within}"
    return constraint.label
