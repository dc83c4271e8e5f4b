"""Tier 1 in a search (`--eval TASK`): the reference evaluated once on the task before any trial (a task that cannot be
loaded here is bad input then, not after the search), then, after the trial loop, each configuration on the front,
best first, while the budget left covers its forecast; those it does not are named. Each evaluation runs in a worker
(autotune/worker/evaluation.py) with the configuration's plan; the answers are stored with the study
(autotune/study/evaluations.py) and read back as each finalist's figures (autotune/figures/task.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune import for_tests
from autotune.errors import SearchError, UserError
from autotune.figures.metrics import TASK_ACCURACY, TASK_FLIPS, TASK_RECOVERY, THROUGHPUT, WARMUP
from autotune.measure.prepare import Prepared, plan_target, trial_spec
from autotune.process.results import Candidate, TaskResult, TaskSpec
from autotune.process.runner import Limits, run_in_worker
from autotune.search.events import SearchEvents
from autotune.search.session import Session
from autotune.space import Config, build_plan
from autotune.specs import EvalSpec, SearchRequest
from autotune.study import TrialRecord
from autotune.study.evaluations import evaluated_numbers, store_answers, store_task, stored_task
from autotune.study.opened import OpenedStudy

EXPECTED_FINALISTS = 4  # the front's size the loop leaves time for: its evaluations' forecast is kept from the loop
TASK_PHASE = "task"  # the worker's phase of a task that cannot be loaded (autotune/worker/tasks.py)


@dataclass(frozen=True)
class ReferenceEvaluation:
    """The task the study is evaluated on, and the reference's answers, as stored with the study."""

    stored: dict[str, Any]
    new: bool  # evaluated by this search (to be stored), not read from the study

    @property
    def seconds(self) -> float:
        return float(self.stored["reference"]["seconds"])

    def line(self) -> str:
        answers = self.stored["reference"]["answers"]
        right = sum(answers.values()) / len(answers) if answers else 0.0
        when = f"evaluated in {self.seconds:.1f}s" if self.new else "stored with the study"
        return (
            f"task {self.stored['task']} ({len(answers)} items, {self.stored['metric']}): the reference answers "
            f"{right:.1%} right ({when})"
        )


def evaluate_reference(
    request: SearchRequest, prepared: Prepared, existing: Any, workdir: Path, deadline: float | None,
    events: SearchEvents,
) -> ReferenceEvaluation:  # fmt: skip
    """The reference's answers: stored with a resumed study evaluated on the same task, else evaluated now. A task that
    cannot be loaded here is a UserError; a study evaluated on another task is refused."""
    asked = request.evaluation
    assert asked is not None
    stored = stored_task(existing) if existing is not None else None
    if stored is not None:
        if (stored["task"], stored.get("limit")) != (asked.task, asked.limit):
            raise UserError(
                f"the study was evaluated on --eval {stored['task']} (--eval-limit {stored.get('limit') or 'all'}); "
                "give the same, or pass --study NEW_NAME to evaluate on another task"
            )
        return ReferenceEvaluation(stored, new=False)
    events.progress("evaluating the reference on the task (lm-evaluation-harness)")
    spec = evaluation_spec(request, prepared, prepared.reference_config)
    result = run_in_worker(spec, workdir / "evaluation-reference", Limits(request.budget.trial_timeout_s, deadline))
    if not result.ok:
        raise _reference_error(asked, result)
    evaluated = result.details.evaluation
    stored = {
        **asked.to_json(),
        "metric": evaluated.metric if evaluated else None,
        "reference": {"answers": evaluated.answers if evaluated else {}, "seconds": _seconds(result)},
        "unevaluated": [],
    }
    return ReferenceEvaluation(stored, new=True)


def _reference_error(asked: EvalSpec, result: TaskResult) -> Exception:
    if result.phase == TASK_PHASE:
        return UserError(result.message)
    first = result.message.splitlines()[0] if result.message else result.outcome.value
    return SearchError(f"--eval {asked.task}: the reference's evaluation failed ({result.outcome.value}: {first})")


def evaluation_spec(request: SearchRequest, prepared: Prepared, config: Config) -> TaskSpec:
    """The evaluate task of one configuration: a trial's spec, its plan, the task; a fault planted as in its trial."""
    plan = build_plan(config, plan_target(prepared.hardware.profile, request))
    spec = trial_spec(request, prepared, config, plan)
    spec.task = "evaluate"
    spec.candidate = Candidate(config, plan)
    spec.evaluation = request.evaluation
    spec.fault = for_tests.fault_for(-1, config)
    return spec


def reserved_s(reference: ReferenceEvaluation, deadline: float | None) -> float:
    """What the trial loop leaves of the budget for the finalists' evaluations: EXPECTED_FINALISTS of the reference's,
    at most half the budget left."""
    if deadline is None:
        return 0.0
    return min(EXPECTED_FINALISTS * reference.seconds, max(0.0, deadline - time.monotonic()) / 2)


def forecast_s(reference: ReferenceEvaluation, record: TrialRecord, reference_record: TrialRecord | None) -> float:
    """A finalist's evaluation: the reference's, longer as the finalist generates slower, and its warm-up."""
    slower = 1.0
    if reference_record is not None:
        theirs, ours = reference_record.metrics.get(THROUGHPUT.name), record.metrics.get(THROUGHPUT.name)
        slower = max(1.0, theirs / ours) if theirs and ours else 1.0
    return reference.seconds * slower + record.metrics.get(WARMUP.name, 0.0)


def evaluate_finalists(
    session: Session, reference: ReferenceEvaluation, deadline: float | None, events: SearchEvents
) -> tuple[str, ...]:
    """Each configuration on the front not yet evaluated, best first, while the budget left covers its forecast; the
    summary's lines: the task, each finalist's figures, those the budget left unevaluated."""
    opened = OpenedStudy.of(session.study, session.storage_url)
    done = evaluated_numbers(session.study.user_attrs)
    reference_record = next((r for r in opened.launched if "reference" in r.roles and r.complete), None)
    lines, unevaluated = [reference.line()], []
    for record in opened.front:
        if record.number in done:
            continue
        expected = forecast_s(reference, record, reference_record)
        left = deadline - time.monotonic() if deadline is not None else None
        if left is not None and expected > left:
            unevaluated.append(f"#{record.number} (may take {expected:.0f}s, {max(left, 0):.0f}s left)")
            continue
        events.progress(f"evaluating trial #{record.number} on the task (lm-evaluation-harness)")
        lines.append(_evaluate(session, record, expected, deadline))
    if unevaluated:
        lines.append(f"not evaluated on the task, the budget left could not: {'; '.join(unevaluated)}")
    store_task(session.study, {**reference.stored, "unevaluated": unevaluated})
    return tuple(lines)


def _evaluate(session: Session, record: TrialRecord, expected: float, deadline: float | None) -> str:
    request = session.request
    spec = evaluation_spec(request, session.prepared, record.config)
    workdir = session.workdir / f"evaluation-{record.number}"
    result = run_in_worker(spec, workdir, Limits(request.budget.trial_timeout_s, deadline))
    took = f"{_seconds(result):.1f}s, forecast {expected:.1f}s"
    if not result.ok:
        first = result.message.splitlines()[0] if result.message else ""
        return f"#{record.number}: not evaluated, {result.outcome.value}: {first[:160]} ({took})"
    evaluated = result.details.evaluation
    answers, path = (evaluated.answers, evaluated.path) if evaluated else ({}, None)
    store_answers(session.study, record.number, {"answers": answers, "seconds": _seconds(result), "path": path})
    opened = OpenedStudy.of(session.study, session.storage_url)
    figures = next(r for r in opened.records if r.number == record.number).metrics
    shown = ", ".join(
        f"{metric.heading} {metric.text(figures)}" for metric in (TASK_ACCURACY, TASK_RECOVERY, TASK_FLIPS)
    )
    return f"#{record.number}: {shown} ({took})"


def _seconds(result: TaskResult) -> float:
    return float(result.timings.get("wall", 0.0))
