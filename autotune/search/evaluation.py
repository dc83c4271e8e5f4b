"""Tier 1 (`--eval TASK`): the reference evaluated once on the task before any trial (a task that cannot be loaded here
is bad input then, not after the search); then configurations evaluated one at a time: after the trial loop of a
search or of a worker, each configuration on the front, best first; with `autotune evaluate`, those it chooses.

Each is claimed first (study/claims.py, Evaluations), as a trial's configuration is: of all the processes of a study (a
search, its workers on every machine, an `autotune evaluate`), exactly one evaluates it, under a heartbeat, and one
whose process died is taken by the next process free, once (study/recovery.py). A process with nothing left to take
waits while others evaluate, so that it takes the evaluation of one that dies. Each evaluation starts only while the
budget left covers its forecast; those it does not are named, and stored as left out. It runs in a worker
(autotune/worker/evaluation.py) with the configuration's plan; the answers are stored with the study
(autotune/study/evaluations.py) and read back as each finalist's figures (autotune/figures/task.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune import for_tests
from autotune.errors import SearchError, UserError
from autotune.figures.metrics import TASK_ACCURACY, TASK_FLIPS, TASK_RECOVERY, THROUGHPUT, WARMUP
from autotune.measure.prepare import Prepared, plan_target, trial_spec
from autotune.process.results import Candidate, Outcome, TaskResult, TaskSpec
from autotune.process.runner import Limits, run_in_worker
from autotune.search.events import SearchEvents
from autotune.search.interrupts import Interrupted, deferred
from autotune.search.session import Session
from autotune.search.trial import HEARTBEAT_EVERY_S
from autotune.space import Config, build_plan
from autotune.specs import EvalSpec, SearchRequest
from autotune.study import GRACE_PERIOD_S, TrialRecord
from autotune.study.claims import DONE, FAILED, INTERRUPTED, RUNNING, EvaluationClaim, Evaluations
from autotune.study.evaluations import evaluated_numbers, store_answers, store_left_out, stored_task
from autotune.study.opened import OpenedStudy
from autotune.study.recovery import Heartbeat
from autotune.units import first_line

EVALUATING = "evaluating the task (tier 1)"  # what the summaries call the time spent evaluating
EXPECTED_FINALISTS = 4  # the front's size the loop leaves time for: its evaluations' forecast is kept from the loop
TASK_PHASE = "task"  # the worker's phase of a task that cannot be loaded (autotune/worker/tasks.py)


@dataclass(frozen=True)
class ReferenceEvaluation:
    """The task the study is evaluated on, and the reference's answers, as stored with the study."""

    stored: dict[str, Any]
    new: bool  # evaluated by this search (to be stored), not read from the study

    @classmethod
    def stored_in(cls, study: Any) -> ReferenceEvaluation | None:
        """The study's task and reference, where it was searched with --eval."""
        stored = stored_task(study)
        return cls(stored, new=False) if stored else None

    @property
    def seconds(self) -> float:
        return float(self.stored["reference"]["seconds"])

    @property
    def task(self) -> EvalSpec:
        """The task as --eval asked it: every configuration of the study is evaluated on the same items."""
        return EvalSpec(self.stored["task"], self.stored.get("limit"))

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
    spec = evaluation_spec(request, prepared, prepared.reference_config, asked, finalist=False)
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


def evaluation_spec(
    request: SearchRequest, prepared: Prepared, config: Config, task: EvalSpec, finalist: bool = True
) -> TaskSpec:
    """The evaluate task of one configuration: a trial's spec, its plan, the task; a fault planted as in its trial, or
    in every finalist's evaluation (autotune/for_tests.py)."""
    plan = build_plan(config, plan_target(prepared.hardware.profile, request, prepared.traffic))
    spec = trial_spec(request, prepared, config, plan)
    spec.task = "evaluate"
    spec.candidate = Candidate(config, plan)
    spec.evaluation = task
    spec.fault = for_tests.fault_for(for_tests.FINALISTS if finalist else -1, config)
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


Chooser = Callable[[OpenedStudy], Sequence[TrialRecord]]  # the configurations to evaluate, in order, as the study is


def the_front(opened: OpenedStudy) -> Sequence[TrialRecord]:
    return opened.front


WAIT_S = 5.0  # how often a process with nothing left to take looks again at the evaluations others run


def evaluate_finalists(
    session: Session,
    reference: ReferenceEvaluation,
    deadline: float | None,
    events: SearchEvents,
    chosen: Chooser = the_front,
    again: bool = False,
) -> tuple[str, ...]:
    """The configurations `chosen` picks (the front's, best first) that are not evaluated yet, each claimed, then
    evaluated while the budget left covers its forecast; `again`: one whose evaluation failed or was interrupted twice
    is taken too (`autotune evaluate --trial`). The summary's lines: the task, each evaluation's figures, those the
    budget left unevaluated."""
    return (reference.line(), *Evaluator(session, reference, deadline, events, again).run(chosen))


@dataclass
class Evaluator:
    """One process evaluating the study's configurations, each claimed first."""

    session: Session
    reference: ReferenceEvaluation
    deadline: float | None
    events: SearchEvents
    again: bool = False
    token: int = field(default_factory=lambda: random.SystemRandom().randrange(1, 2**31))  # this process's, in claims
    left_out: dict[int, str] = field(default_factory=dict)  # trial -> why the budget left it out
    taken: set[int] = field(default_factory=set)  # the trials this process took: once each
    failed: list[int] = field(default_factory=list)  # those whose evaluation failed (an error, not the budget)

    @property
    def evaluations(self) -> Evaluations:
        return Evaluations(self.session.claims)

    def run(self, chosen: Chooser) -> list[str]:
        """Take and evaluate, one at a time, until nothing is left to take and no other process evaluates any."""
        lines: list[str] = []
        waited_since: float | None = None
        while True:
            self.session.recovery()  # the evaluations of dead processes given back, with the trials'
            opened = OpenedStudy.of(self.session.study, self.session.storage_url)
            taken, others = self._take_next(chosen(opened), opened)
            if taken is not None:
                lines.append(self._evaluate(*taken))
                waited_since = None
                continue
            waited_since = waited_since or time.monotonic()
            if not others or not self._may_wait(waited_since):
                break
            numbers = ", ".join(f"#{number}" for number in others)
            self.events.progress(f"waiting: other processes evaluate {numbers} (one whose process dies is taken here)")
            time.sleep(WAIT_S)
        if self.left_out:
            listed = "; ".join(f"#{number} ({why})" for number, why in self.left_out.items())
            lines.append(f"not evaluated on the task, the budget left could not: {listed}")
        return lines

    def _may_wait(self, since: float) -> bool:
        """While the budget lasts, and no longer than another process's evaluation can last alive (its timeout) and
        dead (the grace its heartbeat has)."""
        now = time.monotonic()
        longest = self.session.request.budget.trial_timeout_s + GRACE_PERIOD_S
        return (self.deadline is None or now < self.deadline) and now - since < longest

    def _take_next(
        self, candidates: Sequence[TrialRecord], opened: OpenedStudy
    ) -> tuple[tuple[TrialRecord, float] | None, list[int]]:
        """The first candidate this process may evaluate, claimed, with its forecast; and those other processes are
        evaluating now."""
        done = evaluated_numbers(opened.study.user_attrs)
        claims = self.evaluations.claims()
        reference_record = next((r for r in opened.launched if "reference" in r.roles and r.complete), None)
        others = []
        for record in candidates:
            number, claim = record.number, claims.get(record.number)
            if number in done or number in self.left_out or number in self.taken:
                continue
            if claim is not None and claim.state == RUNNING:
                others.append(number)
                continue
            if claim is not None and not self._may_take(claim):
                continue
            expected = forecast_s(self.reference, record, reference_record)
            left = self.deadline - time.monotonic() if self.deadline is not None else None
            if left is not None and expected > left:
                self._leave_out(number, f"may take {expected:.0f}s, {max(left, 0):.0f}s left")
                continue
            if self.evaluations.take(number, self.token, self.again):
                self.taken.add(number)
                return (record, expected), others
        return None, others

    def _may_take(self, claim: EvaluationClaim) -> bool:
        """A claim that ended without answers: taken when its process was interrupted (once), or when asked again."""
        return claim.free or (self.again and claim.state in (FAILED, INTERRUPTED))

    def _leave_out(self, number: int, why: str) -> None:
        self.left_out[number] = why
        store_left_out(self.session.study, number, why)

    def _evaluate(self, record: TrialRecord, expected: float) -> str:
        """Evaluate a trial this process claimed, under a heartbeat; store its answers while the claim is still its."""
        session, number = self.session, record.number
        request = session.request
        spec = evaluation_spec(request, session.prepared, record.config, self.reference.task)
        workdir = session.workdir / f"evaluation-{number}"
        self.events.progress(f"evaluating trial #{number} on the task (lm-evaluation-harness)")
        beat = lambda: self.evaluations.beat(number, self.token)  # noqa: E731
        try:
            with Heartbeat(beat, HEARTBEAT_EVERY_S, f"the evaluation of trial #{number}"):
                result = run_in_worker(spec, workdir, Limits(request.budget.trial_timeout_s, self.deadline))
        except Interrupted:
            with deferred():
                self.evaluations.end(number, self.token, INTERRUPTED)  # the next process free takes it
            raise
        took = f"{_seconds(result):.1f}s, forecast {expected:.1f}s"
        if result.outcome == Outcome.BUDGET:
            self.evaluations.give_back(number, self.token)
            self._leave_out(number, "the budget ran out during its evaluation")
            return f"#{number}: not evaluated, the budget ran out during its evaluation ({took})"
        if not result.ok:
            self.evaluations.end(number, self.token, FAILED)
            self.failed.append(number)
            return f"#{number}: not evaluated, {result.outcome.value}: {first_line(result.message, 300)} ({took})"
        return self._store(record, result, took)

    def _store(self, record: TrialRecord, result: TaskResult, took: str) -> str:
        number, study = record.number, self.session.study
        if not self.evaluations.holds(number, self.token):
            return (
                f"#{number}: evaluated, not stored: its heartbeats stopped reaching the database for longer than the "
                f"grace period, and another process took its evaluation over ({took})"
            )
        evaluated = result.details.evaluation
        answers, path = (evaluated.answers, evaluated.path) if evaluated else ({}, None)
        with deferred():
            store_answers(study, number, {"answers": answers, "seconds": _seconds(result), "path": path})
            self.evaluations.end(number, self.token, DONE)
        opened = OpenedStudy.of(study, self.session.storage_url)
        figures = next(r for r in opened.records if r.number == number).metrics
        shown = ", ".join(
            f"{metric.heading} {metric.text(figures)}" for metric in (TASK_ACCURACY, TASK_RECOVERY, TASK_FLIPS)
        )
        return f"#{number}: {shown} ({took})"


def front_evaluated(opened: OpenedStudy) -> str:
    """Which of the front's finalists are evaluated on the task, whichever process evaluated them."""
    done = evaluated_numbers(opened.study.user_attrs)
    front = [record.number for record in opened.front]
    evaluated = [f"#{number}" for number in front if number in done]
    listed = ", ".join(evaluated) or "none"
    return f"the front's {len(front)} finalists: {len(evaluated)} evaluated on the task ({listed})"


def _seconds(result: TaskResult) -> float:
    return float(result.timings.get("wall", 0.0))
