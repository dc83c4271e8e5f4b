"""Trials as autotune records: what was launched, what it measured, why it failed, which are on the front."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.figures.capacity import Capacity
from autotune.figures.constraints import Constraint, violations
from autotune.figures.metrics import OBJECTIVES, Metric
from autotune.figures.quality import PREFILL
from autotune.process.results import Blame, CompileFigures, Outcome, TaskResult
from autotune.space import Config, config_key
from autotune.space.plan import Plan
from autotune.study import migrations
from autotune.study.evaluations import evaluation_figures
from autotune.units import first_line
from autotune.workloads import KindDetails, details_of, details_written

log = logging.getLogger(__name__)
FAIL_REASON_ATTR = "fail_reason"  # one line, on every failed trial, where Optuna's tools show it
COMPILE_ATTR = "compile"  # what a trial compiled: cold or warm, torch's seconds, its archive's artifact id

MAX_INTERRUPTIONS = 1  # an interrupted configuration is retried once, then never run again


@dataclass(frozen=True)
class TrialRecord:
    """One trial as autotune sees it, read back from storage."""

    number: int
    state: str
    config: Config
    roles: tuple[str, ...]
    outcome: str | None  # None: skipped or still running
    message: str
    phase: str | None
    metrics: dict[str, float]
    timings: dict[str, float]
    environment: dict[str, Any]
    plan: Plan | None  # as launched, or as the worker ran it where it adapted it
    skipped: str | None
    duration_s: float | None
    pid: int | None
    log_tail: str
    config_key: str | None = None
    interrupted: bool = False  # a signal stopped it, or its process died while it ran; retried once
    run_id: str | None = None  # the `search --devices` run whose worker measured it
    constraints: dict[str, float] = field(default_factory=dict)  # Optuna's values: feasible when all <= 0
    finished_at: datetime | None = None
    details: KindDetails | None = None  # its kind's own (serve: the command that ran, figures per load level)
    capacity: Capacity | None = None  # an SLO or a capacity probe: its unit, target, points and what stopped it
    blame: Blame | None = None  # failed: the knob value its failure points at, for certain or suspected
    quality_path: str = PREFILL  # where its quality figures came from (autotune.figures.quality)
    compiled: CompileFigures | None = None  # what it compiled, cold or warm, and its archive (studies before: None)

    @property
    def feasible(self) -> bool:
        return all(value <= 0 for value in self.constraints.values())

    @property
    def launched(self) -> bool:
        """Given to a worker: not skipped before launch, not still waiting in the queue."""
        return self.skipped is None and self.state != "WAITING"

    @property
    def complete(self) -> bool:
        return self.state == "COMPLETE"

    @classmethod
    def from_frozen(cls, trial: FrozenTrial) -> TrialRecord:
        attrs = trial.user_attrs
        duration = attrs.get("duration_s")
        died = trial.state == TrialState.FAIL and "outcome" not in attrs and "config_key" in attrs
        outcome, message = attrs.get("outcome"), attrs.get("message", "")
        interrupted = died or outcome == Outcome.INTERRUPTED
        if died:
            outcome = Outcome.CRASHED.value
            message = interrupted_message(attrs.get("owner") or {})
        return cls(
            number=trial.number,
            state=trial.state.name,
            config=migrations.trial_config(attrs.get("config"), trial.params),
            roles=tuple(attrs.get("roles", ())),
            outcome=outcome,
            message=message,
            phase=attrs.get("phase"),
            metrics=attrs.get("metrics", {}),
            timings=attrs.get("timings", {}),
            environment=attrs.get("environment", {}),
            plan=Plan.from_json(migrations.plan(attrs["plan"])) if attrs.get("plan") else None,
            skipped=attrs.get("skipped"),
            duration_s=duration,
            pid=attrs.get("pid"),
            log_tail=attrs.get("log_tail", ""),
            config_key=attrs.get("config_key"),
            interrupted=interrupted,
            run_id=attrs.get("run_id"),
            constraints=dict(trial.constraints),
            finished_at=trial.datetime_complete,
            details=details_of(attrs),
            capacity=Capacity.from_json(migrations.capacity(attrs["capacity"])) if attrs.get("capacity") else None,
            blame=Blame.from_json(attrs["blame"]) if attrs.get("blame") else None,
            quality_path=migrations.quality_path(attrs.get("quality_path")),
            compiled=CompileFigures.from_stored(attrs[COMPILE_ATTR]) if attrs.get(COMPILE_ATTR) else None,
        )


def interrupted_message(owner: dict[str, Any]) -> str:
    return (
        f"interrupted: its process (pid {owner.get('pid')} on {owner.get('host')}) died or stopped "
        "sending heartbeats before the trial finished; retried once"
    )


def records(study: optuna.Study) -> list[TrialRecord]:
    return [TrialRecord.from_frozen(trial) for trial in study.get_trials(deepcopy=False)]


def with_evaluations(read: list[TrialRecord], study_attrs: dict[str, Any]) -> list[TrialRecord]:
    """The records, each evaluated finalist's tier-1 figures among its metrics (study/evaluations.py)."""
    evaluated = evaluation_figures(study_attrs)
    return [replace(r, metrics={**r.metrics, **evaluated[r.number]}) if r.number in evaluated else r for r in read]


def front_numbers(study: optuna.Study) -> set[int]:
    """The numbers of the study's trials on its front: Optuna's `best_trials` (the non-dominated complete trials,
    feasible ones only when the study has constraints)."""
    return {trial.number for trial in study.best_trials}


def measured_keys(study: optuna.Study) -> dict[str, int]:
    """Configurations already launched (or running elsewhere) -> the trial number that has them.

    A trial stopped by the budget, or interrupted (a signal, the death of its process), does not
    count: its configuration was never measured. An interrupted configuration is retried once; when
    its retry is interrupted too, it counts, so neither the planner nor the sampler brings it back.
    """
    seen: dict[str, int] = {}
    interruptions: dict[str, list[int]] = {}
    for record in records(study):
        if record.interrupted and record.config_key:
            interruptions.setdefault(record.config_key, []).append(record.number)
        unmeasured = record.outcome == Outcome.BUDGET or record.interrupted or record.skipped
        if record.config_key and not unmeasured and record.state in ("COMPLETE", "FAIL", "RUNNING"):
            seen.setdefault(record.config_key, record.number)
    for key, numbers in interruptions.items():
        if len(numbers) > MAX_INTERRUPTIONS:
            seen.setdefault(key, numbers[-1])
    return seen


def awaiting_retry(study: optuna.Study) -> dict[str, int]:
    """Configurations of interrupted trials whose retry is queued or running -> the interrupted trial.

    The retry measures them: nothing else (the planner, the sampler, a random pick) may take them meanwhile.
    """
    trials = study.get_trials(deepcopy=False)
    unfinished_retries = {
        trial.system_attrs["retry_history"][-1]
        for trial in trials
        if trial.system_attrs.get("retry_history") and not trial.state.is_finished()
    }
    return {
        record.config_key: record.number
        for record in map(TrialRecord.from_frozen, trials)
        if record.number in unfinished_retries and record.interrupted and record.config_key
    }


def record_launch(trial: optuna.Trial, config: Config, plan: Plan, roles: list[str]) -> None:
    trial.set_user_attr("config", config)
    trial.set_user_attr("config_key", config_key(config))
    trial.set_user_attr("plan", plan.to_json())
    trial.set_user_attr("roles", roles)


def record_result(
    study: optuna.Study,
    trial: optuna.Trial,
    result: TaskResult,
    duration_s: float,
    constraints: Sequence[Constraint] = (),
    objectives: Sequence[Metric] = OBJECTIVES,
) -> None:
    """Store a result and finish the trial: COMPLETE with objective values, or FAIL with its reason.

    A complete trial also gets one Optuna constraint value per constraint (feasible when <= 0).
    """
    trial.set_user_attr("outcome", result.outcome.value)
    trial.set_user_attr("duration_s", duration_s)
    trial.set_user_attr("timings", result.timings)
    trial.set_user_attr("pid", result.pid)
    compiled = result.details.compile
    if compiled is not None and (compiled.compiled or compiled.artifact):
        trial.set_user_attr(COMPILE_ATTR, compiled.to_stored())
    if result.environment:
        trial.set_user_attr("environment", result.environment)
    if result.ok:
        if result.details.plan is not None:  # the worker ran an adapted plan (e.g. another quantized-cache backend)
            trial.set_user_attr("plan", result.details.plan.to_json())
        for kind, details in details_written(result.details.workload).items():
            if details is not None:
                trial.set_user_attr(kind, details)
        if result.details.capacity is not None:
            trial.set_user_attr("capacity", result.details.capacity.to_json())
        if result.details.quality_path is not None:
            trial.set_user_attr("quality_path", result.details.quality_path)
        trial.set_user_attr("metrics", result.metrics)
        trial.set_user_attr("stats", result.stats)
        for key, value in violations(constraints, result.metrics).items():
            trial.set_constraint(key, value)
        study.tell(trial, [result.metrics[metric.name] for metric in objectives])
        return
    trial.set_user_attr("message", result.message)
    trial.set_user_attr(FAIL_REASON_ATTR, fail_reason(result.outcome.value, result.message))
    trial.set_user_attr("phase", result.phase)
    trial.set_user_attr("log_tail", result.log_tail[-3000:])
    if result.blame is not None:
        trial.set_user_attr("blame", result.blame.to_json())
    study.tell(trial, state=TrialState.FAIL)


def fail_reason(outcome: str, message: str) -> str:
    """One short line: the outcome and the first line of its message."""
    return first_line(f"{outcome}: {message.strip()}" if message.strip() else outcome, 200)


def record_skip(study: optuna.Study, trial: optuna.Trial, config: Config, reason: str) -> None:
    """A sampled configuration that is never launched (a rule forbids it, or it was measured already)."""
    trial.set_user_attr("config", config)
    trial.set_user_attr("skipped", reason)
    study.tell(trial, state=TrialState.PRUNED)
