"""What `autotune measure` prints: one configuration's measurement as one JSON document, or its figures as a table
and its capacity probe's lines."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from rich.table import Table

from autotune.cli.printers import capacity_lines, knobs_line, out
from autotune.figures.quality import PATHS

if TYPE_CHECKING:
    from autotune.figures.capacity import Capacity
    from autotune.process.ceiling import Ceiling
    from autotune.process.results import TaskResult
    from autotune.space import Config
    from autotune.specs import ModelSpec, WorkloadSpec


def print_measurement(
    model: ModelSpec, workload: WorkloadSpec, config: Config, result: TaskResult, as_json: bool
) -> None:
    """The measurement's document as JSON, or its figures as a table, then its capacity probe's lines."""
    capacity = result.details.capacity
    document = measurement_document(model, workload, config, result, capacity)
    _print_document(document, as_json, capacity, _workload_line(workload, config))


def _workload_line(workload: WorkloadSpec, config: Config) -> str:
    """ "workload: throughput, the first 8 of 48 requests of demo-trace.jsonl (...), 2 at a time, each with its own
    lengths": what ran, the kind a configuration chose included."""
    from autotune.space.knobs import WorkloadKnob
    from autotune.workloads import describe_workload

    return f"workload: {describe_workload(replace(workload, kind=config.get(WorkloadKnob.name, workload.kind)))}"


def measurement_document(
    model: ModelSpec, workload: WorkloadSpec, config: Config, result: TaskResult, capacity: Capacity | None
) -> dict[str, Any]:
    """What `measure --json` prints: the configuration, the workload it ran, its outcome and figures."""
    from autotune.space.knobs import WorkloadKnob
    from autotune.workloads import details_written, workload_as_run

    return {
        "model": model.id,
        "config": config,
        "workload": workload_as_run(
            {**workload.to_json(), "kind": config.get(WorkloadKnob.name, workload.kind)}
        ),  # ran
        "outcome": result.outcome.value,
        "message": result.message,
        "metrics": result.metrics,
        "stats": result.stats,
        "timings": result.timings,
        "environment": result.environment,
        **details_written(result.details.workload),  # a kind's own (serve: the command that ran, each load level)
        "capacity": capacity.shown() if capacity else None,  # an SLO or a capacity probe: its points, what it found
        "quality_path": result.details.quality_path,  # where its quality figures came from (figures/quality.py)
    }


def _print_document(document: dict[str, Any], as_json: bool, capacity: Capacity | None, workload: str) -> None:
    if as_json:
        print(json.dumps(document))
        return
    out.print(f"{knobs_line(document['config'])} -> {document['outcome']} {document['message']}".rstrip())
    out.print(workload)
    table = Table(title="figures (p50, p95, coefficient of variation, repeats)")
    for column in ("figure", "p50", "p95", "cv", "n"):
        table.add_column(column)
    for name, summary in document["stats"].items():
        table.add_row(name, f"{summary['p50']:.6g}", f"{summary['p95']:.6g}", f"{summary['cv']:.2%}", str(summary["n"]))
    out.print(table)
    for name in sorted(document["metrics"]):
        if name not in document["stats"]:
            out.print(f"{name}: {document['metrics'][name]:.6g}")
    for line in capacity_lines(capacity) if capacity is not None else []:
        out.print(line)
    if document.get("quality_path"):
        out.print(f"quality measured {PATHS[document['quality_path']]}")


def print_ceilings(figures: list[Ceiling], as_json: bool) -> None:
    """`autotune ceiling`: one line per batch size, or a JSON list."""
    print(json.dumps([asdict(f) for f in figures], indent=1) if as_json else "\n".join(f.line() for f in figures))


def print_ceiling_failure(result: TaskResult) -> None:
    """A ceiling task that measured nothing: its outcome and message, then the end of the worker's log."""
    where = f" in phase {result.phase}" if result.phase else ""
    print(f"autotune: the hand loop ended as {result.outcome.value}{where}: {result.message}", file=sys.stderr)
    if result.log_tail:
        print(result.log_tail.rstrip(), file=sys.stderr)
