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
from autotune.figures.metrics import METRICS, OBJECTIVES, THROUGHPUT, Metric
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
class Cut:
    """The constraint that left no candidate: the constraints before it in the order given, applied one after the
    other, leave `left`; of those, the ones that measured its figure and the nearest to its bound."""

    constraint: Constraint
    narrowed: list[tuple[Constraint, int]]  # each constraint before it, and the candidates it leaves
    left: int
    unmeasured: int  # of `left`, those that never measured its figure
    nearest: TrialRecord | None  # of those that measured it, the nearest to its bound

    def __str__(self) -> str:
        """ "peak memory <= 0.04 GB leaves 5; answer flips vs reference <= 0.05 cuts the last 5: the nearest, #4, has
        0.061; 3 were not evaluated on the task (autotune evaluate evaluates them)"."""
        metric = METRICS[self.constraint.metric]
        before = "".join(f"{constraint.label} leaves {count}; " for constraint, count in self.narrowed)
        why = []
        if self.nearest is not None:
            value = self.nearest.metrics[metric.name]
            unit = f" {metric.unit}" if metric.unit and metric.unit != "nats/token" else ""  # as the constraint's label
            why.append(f"the nearest, #{self.nearest.number}, has {value:.4g}{unit}")
        if self.unmeasured:
            were = "was" if self.unmeasured == 1 else "were"
            never = (
                "not evaluated on the task (autotune evaluate evaluates them)"
                if metric.after_search
                else "not measured"
            )
            why.append(f"{self.unmeasured} {were} {never}")
        return f"{before}{self.constraint.label} cuts the last {self.left}: {'; '.join(why)}"


@dataclass(frozen=True)
class Pick:
    goal: Goal
    constraints: list[Constraint]
    considered: int  # complete trials
    feasible: list[TrialRecord]  # complete trials that satisfy every constraint and measured the goal
    chosen: TrialRecord | None
    on_front: bool  # the chosen trial is on the Pareto front of the feasible trials
    cut: Cut | None = None  # where nothing is chosen: the constraint that cut the last candidate

    def why_none(self) -> str:
        """For exit status 3: what was asked, which constraint cut the last candidate, and its nearest miss."""
        asked = ", ".join(c.label for c in self.constraints) or "no constraints"
        if self.considered == 0:
            return f"no trial of the study has completed, so nothing satisfies {asked}"
        said = f"none of the {self.considered} complete trials satisfies {asked}"
        if self.cut is not None:
            return f"{said}: {self.cut}"
        return f"{said}: none of them measured {self.goal.metric.label}"


def pick(
    records: Sequence[TrialRecord],
    constraints: Sequence[Constraint],
    goal: Goal = DEFAULT_GOAL,
    objectives: Sequence[Metric] = OBJECTIVES,
) -> Pick:
    complete = [record for record in records if record.complete and record.launched]
    feasible = ranked(complete, constraints, goal, objectives)
    chosen = feasible[0] if feasible else None
    on_front = chosen is not None and chosen.number in non_dominated(feasible, objectives)
    cut = None if feasible else _cut(complete, constraints)
    return Pick(goal, list(constraints), len(complete), feasible, chosen, on_front, cut)


def ranked(
    records: Sequence[TrialRecord],
    constraints: Sequence[Constraint],
    goal: Goal = DEFAULT_GOAL,
    objectives: Sequence[Metric] = OBJECTIVES,
) -> list[TrialRecord]:
    """The complete trials that satisfy every constraint and measured the goal, the pick first."""
    feasible = [
        record
        for record in records
        if record.complete
        and record.launched
        and not failed(constraints, record.metrics)
        and _finite(record.metrics.get(goal.metric.name))
    ]
    return sorted(feasible, key=lambda record: _rank(record, goal, objectives))


def _cut(candidates: Sequence[TrialRecord], constraints: Sequence[Constraint]) -> Cut | None:
    """The constraints applied one after the other, in the order given: the one that leaves no candidate."""
    narrowed: list[tuple[Constraint, int]] = []
    left = list(candidates)
    for constraint in constraints:
        kept = [record for record in left if constraint.holds(record.metrics)]
        if not kept:
            measured = [record for record in left if _finite(record.metrics.get(constraint.metric))]
            nearest = min(measured, key=lambda record: constraint.violation(record.metrics), default=None)
            return Cut(constraint, narrowed, len(left), len(left) - len(measured), nearest)
        narrowed.append((constraint, len(kept)))
        left = kept
    return None


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _rank(record: TrialRecord, goal: Goal, objectives: Sequence[Metric]) -> tuple[float, ...]:
    m = record.metrics
    first = -m[goal.metric.name] if goal.maximize else m[goal.metric.name]
    ties = (metric.minimised(m[metric.name]) for metric in objectives)
    return (first, *ties, record.number)
