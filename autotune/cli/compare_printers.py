"""What `compare` prints: two studies compared, each front configuration's figures moved and each level of the earlier
front, as a table, Markdown (a CI job's summary page) or one JSON document; on the task, task_printers.py. Nothing
here decides anything."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rich.table import Table

from autotune.cli.printers import capacity_json, in_markdown, knobs_line, out
from autotune.cli.task_printers import print_task, task_json, task_markdown
from autotune.figures.metrics import COLUMN, WHERE_MEASURED, compared
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.analysis.capacity import AtCapacity
    from autotune.analysis.compare import Comparison, Level, Tolerances


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
    print_task(comparison)


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
        f"### autotune compare: {in_markdown(study_a)} → {in_markdown(study_b)}: {verdict}",
        "",
        f"Tolerances: throughput -{t.throughput:.0%}, memory +{t.memory:.0%}, KL +{t.kl:.0%}.",
        *(
            [f"Figures at each configuration's capacity {in_markdown(comparison.target.within)}."]
            if comparison.target
            else []
        ),
        *([f"{in_markdown(comparison.quality_apart)}."] if comparison.quality_apart else []),
        *([f"Compared across traffic: {in_markdown(comparison.traffic_apart)}."] if comparison.traffic_apart else []),
        "",
        "| configuration | front | " + " | ".join(columns.values()) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for movement in comparison.movements:
        cells = [_change(movement.change, name) for name in columns]
        lines.append(
            f"| `{in_markdown(knobs_line(movement.config))}` | {'+'.join(movement.on_front)} | {' | '.join(cells)} |"
        )
    lines += ["", "Each level of the earlier front:", ""]
    lines += [f"- {in_markdown(_level_line(study_b, level, t))}" for level in comparison.levels]
    return "\n".join([*lines, *task_markdown(comparison)])


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
                "at_capacity_before": capacity_json(level.at_capacity_before),
                "at_capacity_after": capacity_json(level.at_capacity_after),
                "change": level.change(),
                "regression": level.regression(),
                "regressed_figure": level.regressed_figure(tolerances),
            }
            for level in comparison.levels
        ],
        **({"task": task_json(comparison)} if comparison.task else {}),
    }


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
