"""Nights side by side: the front of each study of a series (one study per night), and what regressed.

Each night is summed up by its front: every point's throughput, peak memory and KL, and the best of each
(the highest throughput, the lowest memory, the lowest KL on the front). A night regressed when
`autotune compare` with the night before says so, with the same tolerances (autotune.analysis.compare). Nights that
probed capacities are summed up at capacity too (the fastest point's batch or load and what it carries there), and a
night searched within another SLO than the night before is not compared with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from autotune.analysis.capacity import AtCapacity, at_capacity
from autotune.analysis.compare import Comparison, GivenTolerances, compare
from autotune.figures.capacity import SloTarget
from autotune.figures.metrics import KL_DIVERGENCE, METRICS, PEAK_MEMORY, THROUGHPUT, Metric, in_history
from autotune.space import Config
from autotune.study import TrialRecord
from autotune.study.evaluations import TaskAnswers, task_answers
from autotune.study.opened import OpenedStudy, Terms

DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True)
class Night:
    """One study of the series, as read from storage."""

    study: str
    records: list[TrialRecord]
    front: set[int]  # its trials on the front (Optuna's best_trials)
    device: str  # the device type of its profile (cuda, cpu): the default tolerances of a comparison from it
    terms: Terms | None = None  # what its figures at capacity hold under (its SLO, device, price)
    task: TaskAnswers | None = None  # its answers on its task, where it was evaluated on one (--eval)

    @classmethod
    def of(cls, opened: OpenedStudy) -> Night:
        task = task_answers(opened.study.user_attrs)
        return cls(opened.name, opened.records, opened.front_numbers, opened.settings.device_type, opened.terms, task)


@dataclass(frozen=True)
class FrontPoint:
    number: int
    config: Config
    throughput: float
    memory_gb: float
    kl: float
    capacity: AtCapacity | None = None  # where it probed one: its capacity and what it carries there
    figures: dict[str, float | None] = field(default_factory=dict)  # those of in_history(), None where not measured


@dataclass(frozen=True)
class NightSummary:
    study: str
    date: str | None  # the YYYY-MM-DD in its name
    launched: int  # trials launched
    points: list[FrontPoint]  # its front, fastest first
    previous: str | None  # the night before, if any
    comparison: Comparison | None  # the night before -> this one
    target: SloTarget | None = None  # the SLO it was searched within, where it had one

    @property
    def label(self) -> str:
        return self.date or self.study

    @property
    def best_throughput(self) -> float | None:
        return max((p.throughput for p in self.points), default=None)

    @property
    def lowest_memory_gb(self) -> float | None:
        return min((p.memory_gb for p in self.points), default=None)

    @property
    def lowest_kl(self) -> float | None:
        return min((p.kl for p in self.points), default=None)

    def best(self, metric: Metric) -> float | None:
        """The front's best of a figure of in_history() (the highest or the lowest, by its direction)."""
        values = [value for point in self.points if (value := point.figures.get(metric.name)) is not None]
        if not values:
            return None
        return max(values) if metric.direction == "maximize" else min(values)

    @property
    def fastest_capacity(self) -> AtCapacity | None:
        """The capacity of the front's fastest point, and what it carries there."""
        return self.points[0].capacity if self.points else None

    @property
    def regressed(self) -> list[str]:
        """What regressed since the night before ("throughput", "memory", "KL", "task accuracy", "answer flips vs
        reference"); empty when nothing did."""
        return self.comparison.regressed_figures() if self.comparison else []

    @property
    def worst_loss(self) -> float | None:
        """The largest share of throughput lost at a level of the night before's front that this night meets."""
        levels = self.comparison.levels if self.comparison else []
        return max((level.regression() for level in levels if level.best_after is not None), default=None)

    def verdict(self) -> str:
        """Against the night before: "first night", "ok", or "REGRESSED <figures>" with the worst throughput loss."""
        if self.comparison is None:
            return "first night"
        if self.comparison.not_compared:
            return f"not compared: {self.comparison.not_compared}"
        apart = " (quality measured on other paths: not compared)" if self.comparison.quality_apart else ""
        if not self.regressed:
            return f"ok{apart}"
        worst, figures = self.worst_loss, self.regressed
        loss = ""
        if "throughput" in figures and worst is not None:
            loss = f" ({'' if figures == ['throughput'] else 'throughput '}{-worst:.1%} at worst)"
        return f"REGRESSED {', '.join(figures)}{loss}{apart}"

    def best_change(self, before: NightSummary | None) -> float | None:
        """(best - best before) / best before, of the front's best throughput."""
        now, then = self.best_throughput, before.best_throughput if before else None
        return None if now is None or not then else (now - then) / then


@dataclass(frozen=True)
class History:
    nights: list[NightSummary]

    def before(self, night: NightSummary) -> NightSummary | None:
        index = self.nights.index(night)
        return self.nights[index - 1] if index else None

    @property
    def regressed(self) -> list[NightSummary]:
        return [night for night in self.nights if night.regressed]

    def shows(self, metric: Metric) -> bool:
        """Whether the nights' table, chart and JSON show a figure of in_history(): always, or an optional one (tier
        0's and tier 1's) where some night measured it, and the figure it goes with (`history_with`)."""
        measured = lambda name: any(night.best(METRICS[name]) is not None for night in self.nights)  # noqa: E731
        if not metric.optional:
            return True
        return measured(metric.name) and (not metric.history_with or measured(metric.history_with))


def in_night_order(names: Sequence[str]) -> list[str]:
    """By the date in each name when every name has one (then by name), else as given."""
    if all(DATE.search(name) for name in names):
        return sorted(names, key=lambda name: (_date(name), name))
    return list(names)


def history(nights: Sequence[Night], given: GivenTolerances | None = None) -> History:
    """Each night's front, and its comparison with the night before (tolerances: `given`, else the
    defaults for the earlier night's device, as `autotune compare` takes them)."""
    given = given or GivenTolerances()
    summaries = []
    for index, night in enumerate(nights):
        before = nights[index - 1] if index else None
        comparison = None
        if before is not None:
            terms = (before.terms, night.terms) if before.terms and night.terms else None
            tolerances = given.on(before.device)
            tasks = (before.task, night.task)
            comparison = compare(before.records, before.front, night.records, night.front, tolerances, terms, tasks)
        summaries.append(
            NightSummary(
                study=night.study,
                date=_date(night.study),
                launched=sum(1 for record in night.records if record.launched),
                points=_front_points(night),
                previous=before.study if before else None,
                comparison=comparison,
                target=night.terms.target if night.terms and night.terms.target.slo else None,
            )
        )
    return History(summaries)


def _date(name: str) -> str | None:
    found = DATE.search(name)
    return found.group(0) if found else None


def _front_points(night: Night) -> list[FrontPoint]:
    points = [
        FrontPoint(
            record.number,
            record.config,
            record.metrics[THROUGHPUT.name],
            record.metrics[PEAK_MEMORY.name],
            record.metrics[KL_DIVERGENCE.name],
            at_capacity(record, night.terms) if night.terms else None,
            {metric.name: record.metrics.get(metric.name) for metric in in_history()},
        )
        for record in night.records
        if record.number in night.front
        and record.complete
        and all(m.name in record.metrics for m in (THROUGHPUT, PEAK_MEMORY, KL_DIVERGENCE))
    ]
    return sorted(points, key=lambda point: -point.throughput)
