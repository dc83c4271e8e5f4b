"""After a search: its Pareto front, its report written and stored with the study, for the CLI to print."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune import for_tests
from autotune.figures.metrics import Metric
from autotune.report import default_report_path
from autotune.report.data import ParetoCard, report_data
from autotune.report.html import write_report
from autotune.search.events import SearchSummary
from autotune.space import Config
from autotune.study import DEFAULT_WAITING, Waiting
from autotune.study.artifacts import attach_report
from autotune.study.opened import OpenedStudy


@dataclass(frozen=True)
class Finished:
    """What a search leaves: its summary, its front, the report, and where the artifacts are stored."""

    summary: SearchSummary
    front: list[ParetoCard]  # best first by the first objective
    objectives: tuple[Metric, ...]
    baseline: Config | None  # the front is shown as changes from it
    empty_front_reason: str  # why the front is empty, when it is
    report: Path
    artifacts: str | None  # where trial logs and the report are stored as Optuna artifacts; None: nowhere


def finish(
    summary: SearchSummary, report: Path | None, artifacts: str | None, waiting: Waiting = DEFAULT_WAITING
) -> Finished:
    """Read the study back, write its report (default reports/<study>.html) and attach it to the study; its storage
    waits out an outage as `waiting` says."""
    data = report_data(OpenedStudy.open(summary.study_name, summary.storage_url, waiting))
    path = write_report(data, report or default_report_path(summary.study_name))
    for_tests.hold("report")
    stored_in = attach_report(summary.study_name, summary.storage_url, artifacts, path, waiting)
    return Finished(
        summary=summary,
        front=data.cards,
        objectives=data.settings.objective_metrics,
        baseline=data.settings.prepared.baseline_config,
        empty_front_reason=data.empty_front_reason(),
        report=path,
        artifacts=stored_in,
    )
