"""The data behind the report, computed from the study alone (no drawing here).

Each part of the page has one pure function here: the Pareto front and its cards, the importance of
each knob per objective, the parallel-coordinates axes, the progress of the search (hypervolume and
best-so-far), the failures by reason, and the environment. The HTML module only draws what these
return, so tests check figures, not pixels.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial

from autotune import study as studies
from autotune.analysis.capacity import AtCapacity, capacities
from autotune.analysis.found import BestFound, best_found
from autotune.analysis.pareto import hypervolume, scaled_losses
from autotune.figures.constraints import MEETS_SLO, Constraint
from autotune.figures.metrics import OBJECTIVES, PEAK_MEMORY, THROUGHPUT, Metric
from autotune.report.capacity import CapacityCurve, capacity_curve
from autotune.report.cards import DeployCard, deploy_card
from autotune.report.ceiling import CeilingRow, ceiling_rows
from autotune.report.environment import environment
from autotune.study import StudySettings, TrialRecord
from autotune.study.ceilings import ceilings
from autotune.study.evaluations import evaluated_numbers, stored_task, unevaluated
from autotune.study.opened import OpenedStudy, Terms

NOT_APPLICABLE = "n/a"  # a knob that does not apply to a configuration (e.g. compile without a static cache)

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
class Importances:
    """How much each knob matters, per objective (PED-ANOVA, Optuna's default evaluator)."""

    by_objective: dict[str, dict[str, float]]  # objective metric name -> knob -> share (sums to 1)
    trials: int  # complete trials they are computed from
    note: str  # how far to trust them, or why there are none


@dataclass(frozen=True)
class Axis:
    label: str
    values: list[float]
    ticks: list[str] | None = None  # categorical axis: value i means ticks[i]


@dataclass(frozen=True)
class Parallel:
    """Parallel coordinates of the complete trials: one axis per knob, then the objectives."""

    numbers: list[int]
    axes: list[Axis]
    colour: list[float]  # the first objective


@dataclass(frozen=True)
class Progress:
    """How the front grew, trial by trial: did the budget suffice?"""

    numbers: list[int]  # every launched trial, in order
    trial_time_s: list[float]  # cumulative time spent in trials
    hypervolume: list[float]  # of the feasible complete trials so far, as a share of the final one
    best_throughput: list[float | None]
    best_memory: list[float | None]
    last_improvement: int | None  # the trial that last grew the hypervolume
    verdict: str


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


# ------------------------------------------------------------------------------------- importances


def _target(metric: Metric, index: int) -> Callable[[FrozenTrial], float]:
    """PED-ANOVA's target, which takes lower as better: the objective's value, negated when maximised."""
    return lambda trial: metric.minimised(trial.values[index])


MIN_TRIALS_FOR_IMPORTANCE = 3
FEW_TRIALS = 20


def importances(study: optuna.Study, objectives: Sequence[Metric] = OBJECTIVES) -> Importances:
    """`optuna.importance.get_param_importances` per objective, over the complete trials.

    PED-ANOVA (the default evaluator) compares the best trials with all of them, and takes conditional
    knobs (compile, cache, max_batch_tokens) into account where they apply. Its default top 10% holds
    no trial in a short study, so the top quantile is widened to hold at least 3 trials (at most half).
    """
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    n = len(complete)
    varied = {name for trial in complete for name in trial.distributions}
    varied = {name for name in varied if len({str(t.params.get(name)) for t in complete}) > 1}
    if n < MIN_TRIALS_FOR_IMPORTANCE or not varied:
        why = f"{n} complete trials" if n < MIN_TRIALS_FOR_IMPORTANCE else "no knob took two values"
        return Importances({}, n, f"not computed: {why}; importances need at least {MIN_TRIALS_FOR_IMPORTANCE}")
    quantile = min(0.5, max(0.1, 3 / n))
    evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=quantile)
    by_objective = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small-sample notices; the note below says how far to trust them
        for index, metric in enumerate(objectives):
            try:
                raw = optuna.importance.get_param_importances(
                    study, evaluator=evaluator, params=sorted(varied), target=_target(metric, index), normalize=False
                )
            except (ValueError, RuntimeError) as error:  # the report must render even so
                return Importances({}, n, f"not computed: {error}")
            total = sum(raw.values())
            by_objective[metric.name] = {knob: value / total for knob, value in raw.items()} if total > 0 else {}
    note = f"PED-ANOVA over {n} complete trials (top {quantile:.0%} against all)"
    if n < FEW_TRIALS:
        note += f"; with fewer than {FEW_TRIALS} trials, read them as hints"
    return Importances(by_objective, n, note)


# ---------------------------------------------------------------------------- parallel coordinates


def parallel(
    launched: list[TrialRecord], space: dict[str, Any] | None, objectives: Sequence[Metric] = OBJECTIVES
) -> Parallel | None:
    """One line per complete trial; knobs as categorical axes (`n/a` where a knob does not apply)."""
    complete = [record for record in launched if record.complete]
    if not complete:
        return None
    knob_values = _knob_values(complete, space)
    axes = []
    for knob, values in knob_values.items():
        ticks = [*values, NOT_APPLICABLE] if any(knob not in r.config for r in complete) else list(values)
        index = {str(value): i for i, value in enumerate(ticks)}
        axes.append(Axis(knob, [index[str(r.config.get(knob, NOT_APPLICABLE))] for r in complete], ticks))
    axes += [
        Axis(metric.axis_title, [metric.on_scale(r.metrics[metric.name]) for r in complete]) for metric in objectives
    ]
    first = objectives[0]
    return Parallel([r.number for r in complete], axes, [r.metrics[first.name] for r in complete])


def _knob_values(complete: list[TrialRecord], space: dict[str, Any] | None) -> dict[str, list[str]]:
    """Knobs in the space's order, each with its values as strings (space order, then any others seen)."""
    declared = {knob["name"]: [str(value) for value in knob["values"]] for knob in (space or {}).get("knobs", [])}
    seen: dict[str, list[str]] = {}
    for record in complete:
        for knob, value in record.config.items():
            seen.setdefault(knob, [])
            if str(value) not in seen[knob]:
                seen[knob].append(str(value))
    order = [knob for knob in declared if knob in seen] + [knob for knob in seen if knob not in declared]
    return {
        knob: [v for v in declared.get(knob, []) if v in seen[knob]]
        + [v for v in seen[knob] if v not in declared.get(knob, [])]
        for knob in order
    }


# ----------------------------------------------------------------------------------------- progress


def loss_vectors(records: list[TrialRecord], objectives: Sequence[Metric] = OBJECTIVES) -> np.ndarray:
    """Objectives as losses (all minimised), scaled to [0, 1] over these trials; KL on a log scale."""
    return scaled_losses([record.metrics for record in records], objectives)


def unstarted(runs: list[dict[str, Any]]) -> int:
    """How many planned trials the last search run passed over: the budget left could not finish them."""
    return len(runs[-1].get("passed_over") or []) if runs else 0


def progress(
    launched: list[TrialRecord], objectives: Sequence[Metric] = OBJECTIVES, unstarted: int = 0
) -> Progress | None:
    """Hypervolume (Optuna's WFG) of the feasible complete trials after each launched trial; `unstarted`: planned
    trials the budget left could not finish (a front that stopped growing then says nothing of the budget)."""
    if not launched:
        return None
    usable = [r for r in launched if r.complete and r.feasible]
    scaled = dict(zip((r.number for r in usable), loss_vectors(usable, objectives), strict=True))
    numbers, times, volumes = [], [], []
    best_tps: list[float | None] = []
    best_mem: list[float | None] = []
    points: list[np.ndarray] = []
    spent, fastest, leanest = 0.0, None, None
    for record in launched:
        spent += record.duration_s or 0.0
        if record.number in scaled:
            points.append(scaled[record.number])
            fastest = max(fastest or 0.0, record.metrics[THROUGHPUT.name])
            leanest = min(leanest or math.inf, record.metrics[PEAK_MEMORY.name])
        numbers.append(record.number)
        times.append(spent)
        volumes.append(hypervolume(np.array(points)))
        best_tps.append(fastest)
        best_mem.append(leanest)
    final = volumes[-1]
    shares = [volume / final if final > 0 else 0.0 for volume in volumes]
    last = next((numbers[i] for i in range(len(volumes) - 1, -1, -1) if _grew(volumes, i)), None)
    return Progress(numbers, times, shares, best_tps, best_mem, last, _verdict(numbers, last, unstarted))


def _grew(volumes: list[float], i: int) -> bool:
    previous = volumes[i - 1] if i > 0 else 0.0
    return volumes[i] > previous * (1 + 1e-9) and volumes[i] > 0


def _verdict(numbers: list[int], last: int | None, unstarted: int = 0) -> str:
    if last is None:
        return "No feasible trial completed: the front is empty."
    position = numbers.index(last) + 1
    total = len(numbers)
    text = f"The front last grew at trial #{last}, the {_ordinal(position)} of {total} launched trials"
    if total - position < max(2, total // 5):
        return text + ": it was still growing, so a larger budget would likely find more."
    since = f"; the {total - position} trials since found nothing better"
    if unstarted:
        return (
            text + f"{since}, but the budget left {unstarted} planned trial{'s' if unstarted > 1 else ''} unstarted: "
            "a larger budget would try them."
        )
    return text + f"{since}, so the budget looks sufficient."


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


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
