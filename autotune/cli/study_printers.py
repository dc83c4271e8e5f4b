"""What `best` and `history` print: a stored study's pick, nights side by side, each as a table, Markdown (a CI job's
summary page) or one JSON document; what `compare` prints, compare_printers.py. Nothing here decides anything."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from autotune.cli.printers import capacity_json, in_markdown, knobs_line, out
from autotune.figures.constraints import MEETS_SLO, Constraint
from autotune.figures.metrics import METRICS, Metric, in_history

if TYPE_CHECKING:
    from pathlib import Path

    from autotune.analysis.history import FrontPoint, History
    from autotune.report.best import Best
    from autotune.report.cards import DeployCard


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
        print(f"### autotune history: {count} night{'s' if count != 1 else ''}, regressed: {in_markdown(regressed)}\n")
        print("| " + " | ".join(headings) + " |")
        print("|" + "---|" * len(headings))
        for cells in rows:
            print("| " + " | ".join(in_markdown(cell) for cell in cells) + " |")
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
                "fastest_at_capacity": capacity_json(night.fastest_capacity),
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
    return {**shown, "capacity": capacity_json(point.capacity), **figures}


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
        "capacity": capacity_json(deploy.at_capacity),  # its capacity and what it carries there, with its SLO
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
