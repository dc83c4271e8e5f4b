"""When the best figure of each objective was found: trial number and minutes into its search run.

A best found early with the budget still running says the budget sufficed; one found in the last
minutes says a longer budget would likely have found more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from autotune.figures.metrics import Metric
from autotune.study import TrialRecord

CLOCK_SLACK = timedelta(seconds=1)


@dataclass(frozen=True)
class BestFound:
    metric: Metric
    number: int  # the first trial that measured the best figure
    value: float
    minutes: float | None  # into the search run that measured it; None when that run is not recorded
    run: int | None  # which search run of the study (1 is the first); None when not recorded


def best_found(
    records: Sequence[TrialRecord], objectives: Sequence[Metric], runs: Sequence[Mapping[str, Any]]
) -> list[BestFound]:
    """For each objective, the complete feasible trial with its best figure (the earliest among equals)."""
    usable = [r for r in records if r.complete and r.feasible and all(m.name in r.metrics for m in objectives)]
    windows = [_window(run) for run in runs]
    found = []
    for metric in objectives:
        if not usable:
            break
        best = min(usable, key=lambda r: (metric.minimised(r.metrics[metric.name]), r.number))
        run, minutes = _when(best.finished_at, windows)
        found.append(BestFound(metric, best.number, best.metrics[metric.name], minutes, run))
    return found


def _window(run: Mapping[str, Any]) -> tuple[datetime, datetime] | None:
    try:
        finished = datetime.fromisoformat(run["finished_at"])
        started = finished - timedelta(seconds=float(run.get("elapsed_s", 0.0)))
        return started - CLOCK_SLACK, finished + CLOCK_SLACK  # the run's end is stored to the second
    except (KeyError, TypeError, ValueError):
        return None


def _when(
    finished_at: datetime | None, windows: Sequence[tuple[datetime, datetime] | None]
) -> tuple[int | None, float | None]:
    """Which run measured a trial finished at this time, and how many minutes into it."""
    if finished_at is None:
        return None, None
    moment = finished_at.astimezone(timezone.utc)  # Optuna stores local time without a zone
    for number, window in enumerate(windows, 1):
        if window is not None and window[0] <= moment <= window[1]:
            return number, max((moment - window[0] - CLOCK_SLACK).total_seconds(), 0.0) / 60
    return None, None
