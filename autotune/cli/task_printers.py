"""What `compare` prints of the task (tier 1), where both studies were evaluated on one: each configuration's answers
paired item by item, as a table, Markdown or part of the JSON document, and what regressed beyond chance."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rich.table import Table

from autotune.cli.printers import in_markdown, knobs_line, out
from autotune.figures.task import ALPHA

if TYPE_CHECKING:
    from autotune.analysis.compare import Comparison
    from autotune.analysis.task_changes import TaskChange

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


def print_task(comparison: Comparison) -> None:
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


def task_markdown(comparison: Comparison) -> list[str]:
    task = comparison.task
    if task is None:
        return []
    if task.apart or not task.changes:
        why = f"not compared, {task.apart}" if task.apart else "no configuration on either front was evaluated in both"
        return ["", f"On the task: {in_markdown(why)}."]
    rows = [
        f"| {' | '.join(in_markdown(cell) for cell in _task_cells(change, comparison))} |" for change in task.changes
    ]
    return ["", f"{in_markdown(_task_sentence(comparison))}:", "", f"| {' | '.join(TASK_HEADINGS)} |",
            "|" + "---|" * len(TASK_HEADINGS), *rows]  # fmt: skip


def task_json(comparison: Comparison) -> dict[str, Any]:
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
