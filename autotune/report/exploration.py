"""What a search explored, as the report shows it (no drawing here): how much each knob matters per objective
(importances), every complete trial across the knobs and the objectives (parallel coordinates), and how the front
grew trial by trial, with whether the budget sufficed (progress). Pure functions of the study's trials, as
data.py's; charts.py draws them."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial

from autotune.analysis.pareto import hypervolume, scaled_losses
from autotune.figures.metrics import OBJECTIVES, PEAK_MEMORY, THROUGHPUT, Metric
from autotune.study import TrialRecord

NOT_APPLICABLE = "n/a"  # a knob that does not apply to a configuration (e.g. compile without a static cache)


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
