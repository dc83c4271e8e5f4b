"""Pick one configuration under constraints, for `autotune best` and nightly jobs.

The pick is the best complete trial for one goal (by default the highest throughput) among those
that satisfy every constraint; ties go to the objectives in order (throughput, memory, KL), then to
the earlier trial. When the goal is one of the study's objectives, the pick is therefore always on
the Pareto front of the feasible trials (a trial that dominated it would win the tie-break).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.analysis.pareto import non_dominated
from autotune.errors import UserError
from autotune.figures.constraints import Constraint, failed, metric_name
from autotune.figures.metrics import OBJECTIVES, THROUGHPUT, Metric
from autotune.study import TrialRecord


@dataclass(frozen=True)
class Goal:
    metric: Metric
    maximize: bool

    def __str__(self) -> str:
        return f"{'maximize' if self.maximize else 'minimize'} {self.metric.name}"


DEFAULT_GOAL = Goal(THROUGHPUT, maximize=True)


def goal_from_flags(maximize: str | None, minimize: str | None) -> Goal:
    """`--maximize throughput` or `--minimize memory` (at most one); throughput by default."""
    if maximize and minimize:
        raise UserError("give --maximize or --minimize, not both")
    if not maximize and not minimize:
        return DEFAULT_GOAL
    flag, text, wanted = ("--maximize", maximize, "maximize") if maximize else ("--minimize", minimize, "minimize")
    assert text is not None
    metric = metric_name(text, flag)
    if metric.direction is not None and metric.direction != wanted:
        other = "--minimize" if wanted == "maximize" else "--maximize"
        raise UserError(f"{flag} {text}: {metric.label} is better when it is {_better(metric)}; use {other} {text}")
    return Goal(metric, maximize=wanted == "maximize")


def _better(metric: Metric) -> str:
    return "higher" if metric.direction == "maximize" else "lower"


@dataclass(frozen=True)
class Pick:
    goal: Goal
    constraints: list[Constraint]
    considered: int  # complete trials
    feasible: list[TrialRecord]  # complete trials that satisfy every constraint and measured the goal
    chosen: TrialRecord | None
    on_front: bool  # the chosen trial is on the Pareto front of the feasible trials

    def why_none(self) -> str:
        """For exit status 3: what was asked, and the nearest miss."""
        asked = ", ".join(c.label for c in self.constraints) or "no constraints"
        if self.considered == 0:
            return f"no trial of the study has completed, so nothing satisfies {asked}"
        return f"none of the {self.considered} complete trials satisfies {asked}"


def pick(
    records: Sequence[TrialRecord],
    constraints: Sequence[Constraint],
    goal: Goal = DEFAULT_GOAL,
    objectives: Sequence[Metric] = OBJECTIVES,
) -> Pick:
    complete = [record for record in records if record.complete and record.launched]
    feasible = [
        record
        for record in complete
        if not failed(constraints, record.metrics) and _finite(record.metrics.get(goal.metric.name))
    ]
    chosen = min(feasible, key=lambda record: _rank(record, goal, objectives), default=None)
    on_front = chosen is not None and chosen.number in non_dominated(feasible, objectives)
    return Pick(goal, list(constraints), len(complete), feasible, chosen, on_front)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _rank(record: TrialRecord, goal: Goal, objectives: Sequence[Metric]) -> tuple[float, ...]:
    m = record.metrics
    first = -m[goal.metric.name] if goal.maximize else m[goal.metric.name]
    ties = (metric.minimised(m[metric.name]) for metric in objectives)
    return (first, *ties, record.number)
