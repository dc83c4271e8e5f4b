"""The HTML report: data computed from the study, then drawn with plotly."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from autotune import study as studies
from autotune.study import DEFAULT_WAITING, Waiting

if TYPE_CHECKING:
    from autotune.analysis.history import History
    from autotune.analysis.tolerances import GivenTolerances


def build_report(study_name: str, storage_url: str, out: Path, waiting: Waiting = DEFAULT_WAITING) -> Path:
    """Render the report of a stored study to `out`."""
    from autotune.report.data import report_data
    from autotune.report.html import write_report
    from autotune.study.opened import OpenedStudy

    return write_report(report_data(OpenedStudy.open(study_name, storage_url, waiting)), out)


def default_report_path(study_name: str, reports_dir: Path = Path("reports")) -> Path:
    return reports_dir / f"{study_name}.html"


def build_history(
    names: list[str],
    storage_url: str | None,
    out: Path,
    given: GivenTolerances,
    artifacts: str | None = None,
    waiting: Waiting = DEFAULT_WAITING,
) -> tuple[History, Path]:
    """The nights of the studies named (names or glob patterns), and their chart written to `out`; with
    `artifacts`, the chart is also stored with the last night's study."""
    from autotune.analysis.history import Night, history, in_night_order
    from autotune.report.history import write_history
    from autotune.study.artifacts import attach_report
    from autotune.study.opened import OpenedStudy

    urls = dict(studies.studies_named(names, storage_url, waiting=waiting))
    nights = [Night.of(OpenedStudy.open(name, urls[name], waiting)) for name in in_night_order(list(urls))]
    found = history(nights, given)
    path = write_history(found, ", ".join(names), out)
    if artifacts:
        attach_report(nights[-1].study, urls[nights[-1].study], artifacts, path, waiting)
    return found, path
