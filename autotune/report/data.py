"""The data behind the report, computed from the study alone (no drawing here).

Each part of the page has one pure function: the Pareto front and its cards, the failures by reason, the environment
here; what the search explored (the importance of each knob per objective, the parallel-coordinates axes, the
progress of the search: hypervolume and best-so-far) in exploration.py. The HTML module only draws what these return,
so tests check figures, not pixels.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

import optuna

from autotune import study as studies
from autotune.analysis.capacity import AtCapacity, capacities
from autotune.analysis.found import BestFound, best_found
from autotune.figures.constraints import MEETS_SLO, Constraint
from autotune.report.capacity import CapacityCurve, capacity_curve
from autotune.report.cards import DeployCard, deploy_card
from autotune.report.ceiling import CeilingRow, ceiling_rows
from autotune.report.environment import environment
from autotune.report.exploration import Importances, Parallel, Progress, importances, parallel, progress, unstarted
from autotune.study import StudySettings, TrialRecord
from autotune.study.ceilings import ceilings
from autotune.study.evaluations import evaluated_numbers, stored_task, unevaluated
from autotune.study.opened import OpenedStudy, Terms

# Failure outcomes in the order the report shows them, with what each means.
FAILURE_MEANINGS: dict[str, str] = {
    "oom": "ran out of memory",
    "timeout": "still running at the trial timeout, killed with its children",
    "unsupported": "a package is missing, or transformers refuses the combination",
    "broken": "ran, but its output is unusable (NaN/inf logits, one token repeated, or empty)",
    "error": "raised an exception",
    "crashed": "killed by a signal, or ended without a valid result",
    "budget": "stopped when the search's budget ran out (not measured)",
    "interrupted": "stopped by Ctrl-C, SIGINT or SIGTERM (not measured; retried once on resume)",
}


@dataclass(frozen=True)
class ParetoCard(DeployCard):
    """A configuration on the front: the card `autotune best` prints (autotune.report.cards), and its capacity curve."""

    curve: CapacityCurve | None = None


@dataclass(frozen=True)
class FailureGroup:
    outcome: str
    meaning: str
    trials: list[TrialRecord]


@dataclass
class ReportData:
    study_name: str
    storage_url: str
    settings: StudySettings
    terms: Terms  # what its figures at capacity hold under: the SLO, the device, the price (read once, with the study)
    trials: list[TrialRecord]  # launched trials, in order
    skipped: list[TrialRecord]
    pareto: list[int]  # trial numbers on the front, best throughput first
    cards: list[ParetoCard]
    baseline: TrialRecord | None
    reference: TrialRecord | None
    outcomes: dict[str, int]
    constraints: list[Constraint] = field(default_factory=list)
    importances: Importances | None = None
    parallel: Parallel | None = None
    progress: Progress | None = None
    failures: list[FailureGroup] = field(default_factory=list)
    excluded: dict[str, dict[str, str]] = field(default_factory=dict)  # knob -> value -> why it is never run again
    suspected: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # still run: words point at them
    environment: dict[str, str] = field(default_factory=dict)
    best: list[BestFound] = field(default_factory=list)  # when each objective's best figure was found
    ceilings: list[CeilingRow] = field(default_factory=list)  # the hand-written decode loop, where measured
    capacities: dict[int, AtCapacity] = field(default_factory=dict)  # trial -> its capacity, where it probed one
    generated_at: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))

    @property
    def complete(self) -> list[TrialRecord]:
        return [trial for trial in self.trials if trial.complete]

    @property
    def infeasible(self) -> list[int]:
        return [trial.number for trial in self.complete if not trial.feasible]

    def infeasible_reason(self, record: TrialRecord) -> str:
        """Why a complete trial is off the front whatever its figures: the bounds it breaks, and where it meets the
        SLO at no batch or load, what its probe found; empty for a feasible one."""
        broken = [name for name, value in record.constraints.items() if value > 0]
        if not record.complete or not broken:
            return ""
        found = self.capacities.get(record.number)
        reasons = [name for name in broken if not (name == str(MEETS_SLO) and found is not None)]
        words = [f"breaks {', '.join(reasons)}"] if reasons else []
        if found is not None and found.size is None:
            words.append(found.capacity_line())
        return "infeasible: " + "; ".join(words)

    def empty_front_reason(self) -> str:
        """Why no configuration is on the front: no complete trial, or none within the constraints."""
        complete = len(self.complete)
        if complete == 0:
            return "no trial has completed yet"
        limits = ", ".join(self.constraint_label(constraint) for constraint in self.constraints)
        return f"none of the {complete} complete trials satisfies {limits}"

    def constraint_label(self, constraint: Constraint) -> str:
        """For people: `peak memory <= 20 GB`, or the SLO's `a capacity within itl_p95<=5ms`."""
        if constraint == MEETS_SLO:
            return f"a capacity {self.terms.target.within}"
        return constraint.label


def collect(study: optuna.Study, storage_url: str) -> ReportData:
    """The report's data of a study already loaded."""
    return report_data(OpenedStudy.of(study, storage_url))


def report_data(opened: OpenedStudy) -> ReportData:
    """Every part of the report, from the study alone."""
    settings, launched, runs = opened.settings, opened.launched, opened.runs
    objectives = settings.objective_metrics
    front = opened.front
    baseline = _with_role(launched, "baseline")
    found = capacities(launched, opened.terms)
    return ReportData(
        study_name=opened.name,
        storage_url=studies.redact(opened.storage_url),
        settings=settings,
        terms=opened.terms,
        trials=launched,
        skipped=[record for record in opened.records if not record.launched],
        pareto=[record.number for record in front],
        cards=[card(record, settings, baseline, found) for record in front],
        baseline=baseline,
        reference=_with_role(launched, "reference"),
        outcomes=dict(Counter(record.outcome for record in launched)),
        constraints=settings.feasibility,
        importances=importances(opened.study, objectives),
        parallel=parallel(launched, settings.space, objectives),
        progress=progress(launched, objectives, unstarted(runs)),
        failures=failure_groups(launched),
        excluded=opened.exclusions,
        suspected=opened.suspicions,
        environment={**environment(settings, runs, launched), **task_evaluation(opened)},
        best=best_found(launched, objectives, runs),
        ceilings=ceiling_rows(ceilings(opened.study), settings.workload, launched),
        capacities=found,
    )


TASK_ROW = "task evaluation (--eval)"


def task_evaluation(opened: OpenedStudy) -> dict[str, str]:
    """Tier 1's row of the environment table: the task, the reference's accuracy, who was evaluated and who not."""
    task = stored_task(opened.study)
    if not task:
        return {}
    answers = task["reference"]["answers"]
    right = sum(answers.values()) / len(answers) if answers else 0.0
    numbers = sorted(evaluated_numbers(opened.study.user_attrs))
    said = [
        f"{task['task']}, {len(answers)} items judged by {task['metric']}; the reference answers {right:.1%} right",
        f"evaluated: {', '.join(f'#{number}' for number in numbers) or 'none'}",
    ]
    if left := unevaluated(opened.study.user_attrs):
        said.append(f"not evaluated, the budget left could not: {'; '.join(left)}")
    return {TASK_ROW: "; ".join(said)}


def _with_role(records: list[TrialRecord], role: str) -> TrialRecord | None:
    return next((record for record in records if role in record.roles and record.complete), None)


# --------------------------------------------------------------------------------- front and cards


def card(
    record: TrialRecord, settings: StudySettings, baseline: TrialRecord | None, found: Mapping[int, AtCapacity]
) -> ParetoCard:
    """The card of a configuration on the front: its deploy card and its capacity curve; `found`: each trial's
    capacity, where it probed one."""
    deploy = deploy_card(record, settings, baseline, found)
    shared = {field.name: getattr(deploy, field.name) for field in fields(deploy)}
    return ParetoCard(**shared, curve=capacity_curve(record, deploy.at_capacity))


# ----------------------------------------------------------------------------------------- failures


def failure_groups(launched: list[TrialRecord]) -> list[FailureGroup]:
    """Failed trials by outcome (oom, timeout, unsupported, broken, ...), known outcomes first."""
    failed = [record for record in launched if record.outcome and record.outcome != "ok"]
    outcomes = [outcome for outcome in FAILURE_MEANINGS if any(r.outcome == outcome for r in failed)]
    outcomes += sorted({r.outcome for r in failed} - set(FAILURE_MEANINGS))  # outcomes added later
    return [
        FailureGroup(outcome, FAILURE_MEANINGS.get(outcome, outcome), [r for r in failed if r.outcome == outcome])
        for outcome in outcomes
    ]
