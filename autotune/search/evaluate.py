"""`autotune evaluate`: configurations of a stored study evaluated on its task (tier 1) later, on demand.

Which: trials by number; or the configuration `autotune best` picks under the same constraints and goal, and where
some of those constraints bound the task's own figures (flips, recovery), the next of best's order each time the last
one evaluated misses them, until one meets them all; or, with neither, the front's finalists not evaluated yet (what a
search evaluates after its trials). Each is claimed and evaluated as a search's finalists are (search/evaluation.py),
under the same budget, and stored as theirs are, so best, compare, history and the report read them as any other.

A study searched without --eval is evaluated on the task --eval names: its reference first, stored as a search stores
it. The process joins the study as a worker does (its model, space, workload and reference from storage), runs no
trial and queues none.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from autotune.analysis.pick import DEFAULT_GOAL, Goal, pick, ranked
from autotune.errors import NothingSatisfiesError, UserError
from autotune.figures.constraints import Constraint, failed
from autotune.figures.metrics import after_search
from autotune.measure.prepare import prepare
from autotune.process import phases
from autotune.search.evaluation import (
    EVALUATING,
    Chooser,
    Evaluator,
    ReferenceEvaluation,
    evaluate_reference,
    the_front,
)
from autotune.search.events import SearchEvents
from autotune.search.session import Checked, check_worker, open_session
from autotune.specs import EvalSpec, WorkerRequest
from autotune.study import TrialRecord
from autotune.study.evaluations import evaluated_numbers, store_task, stored_task
from autotune.study.opened import OpenedStudy


@dataclass(frozen=True)
class EvaluateRequest:
    """Which study (and where, with what budget, on which device: a worker's request), which of its configurations,
    and the task where the study has none yet."""

    worker: WorkerRequest
    trials: tuple[int, ...] = ()  # these trials, in this order
    constraints: tuple[Constraint, ...] = ()  # else best's pick under these, and its goal
    goal: Goal = DEFAULT_GOAL
    task: EvalSpec | None = None  # --eval: for a study searched without it

    @property
    def picks(self) -> bool:
        """Whether it evaluates best's pick (constraints or a goal given) rather than trials or the front."""
        return bool(self.constraints) or self.goal != DEFAULT_GOAL


@dataclass(frozen=True)
class Evaluated:
    """What `autotune evaluate` did: which configurations it was asked for, its lines, and its time."""

    study_name: str
    chosen: str  # which configurations, in words
    lines: tuple[str, ...]  # the task, each evaluation's figures, those the budget left out
    elapsed_s: float
    spent_s: dict[str, float]
    failed: tuple[int, ...] = ()  # the trials whose evaluation failed


def evaluate_stored(request: EvaluateRequest, events: SearchEvents) -> Evaluated:
    """Evaluate the configurations `request` chooses on the study's task, each claimed, while the budget lasts."""
    started = time.monotonic()
    worker = request.worker
    deadline = worker.budget.deadline(started)
    events.progress("reading the study")
    checked, reference_config = check_worker(worker, events)
    assert checked.existing is not None
    opened = OpenedStudy.of(checked.existing, checked.storage_url)
    chosen, said = _chooser(request, opened)
    task = _task(checked, request.task)
    if task is not None and not _unevaluated(chosen, opened):  # no model to load for nothing
        lines = (task.line(), f"nothing to evaluate: {said}, evaluated already")
        return Evaluated(checked.name, said, lines, time.monotonic() - started, {})
    with checked.named_on_interrupt():
        prepared = prepare(
            checked.request, checked.hardware, checked.space, checked.workdir, deadline, reference_config,
            lambda name: events.progress(f"preparing: {phases.label(name)}"),
        )  # fmt: skip
        session = open_session(checked, prepared, events, queue=False)
        if task is None:
            assert request.task is not None
            asked = replace(checked.request, evaluation=request.task)
            task = evaluate_reference(asked, prepared, session.study, checked.workdir, deadline, events)
            store_task(session.study, task.stored)
        evaluating = time.monotonic()
        evaluator = Evaluator(session, task, deadline, events, again=bool(request.trials))
        lines = (task.line(), *evaluator.run(chosen))
        if not evaluator.taken and not evaluator.left_out:
            lines = (*lines, _nothing_taken(chosen, OpenedStudy.of(session.study, session.storage_url), said))
    ended = time.monotonic()
    own = task.seconds if task.new else 0.0
    spent = {"preparing": evaluating - started - own, EVALUATING: ended - evaluating + own}
    return Evaluated(checked.name, said, lines, ended - started, spent, tuple(evaluator.failed))


def _unevaluated(chosen: Chooser, opened: OpenedStudy) -> list[int]:
    """The trials chosen that have no answers stored."""
    done = evaluated_numbers(opened.study.user_attrs)
    return [record.number for record in chosen(opened) if record.number not in done]


def _nothing_taken(chosen: Chooser, opened: OpenedStudy, said: str) -> str:
    """Why this process evaluated none of them: evaluated already (by another process meanwhile), or not to be taken
    again (an evaluation failed, or was interrupted twice: --trial takes it all the same)."""
    left = _unevaluated(chosen, opened)
    if not left:
        return f"nothing to evaluate: {said}, evaluated already"
    numbers = ", ".join(f"#{number}" for number in left)
    return f"not evaluated: {numbers}, whose evaluation failed or was interrupted twice (--trial N evaluates it again)"


def _task(checked: Checked, asked: EvalSpec | None) -> ReferenceEvaluation | None:
    """The study's task; None where it has none and --eval names one (its reference is evaluated first). Another
    task than the study's is refused, as a resumed search refuses it."""
    stored = stored_task(checked.existing)
    if stored is None and asked is None:
        raise UserError(
            f"study {checked.name} was searched without --eval: give --eval TASK (demo, a task of "
            "lm-evaluation-harness, or a folder of task YAML files) to evaluate it on one, its reference first"
        )
    if stored is None:
        return None
    if asked is not None and (stored["task"], stored.get("limit")) != (asked.task, asked.limit):
        raise UserError(
            f"study {checked.name} is evaluated on --eval {stored['task']} "
            f"(--eval-limit {stored.get('limit') or 'all'}); leave out --eval, or give the same"
        )
    return ReferenceEvaluation(stored, new=False)


def _chooser(request: EvaluateRequest, opened: OpenedStudy) -> tuple[Chooser, str]:
    """What to evaluate, as the study is at each turn, and in words; a UserError for a trial that cannot be, and
    NothingSatisfiesError (exit status 3) where best's constraints leave nothing to pick from."""
    if request.trials:
        records = [_complete(opened, number) for number in request.trials]
        return (lambda _: records), ", ".join(f"trial #{number}" for number in request.trials)
    if request.picks:
        return _best_picks(request, opened)
    return the_front, "the front's finalists not evaluated yet"


def _complete(opened: OpenedStudy, number: int) -> TrialRecord:
    record = next((r for r in opened.records if r.number == number), None)
    if record is None:
        last = len(opened.records) - 1
        raise UserError(f"--trial {number}: study {opened.name} has no trial #{number} (its trials: #0 to #{last})")
    if not (record.complete and record.launched):
        what = f"it ended {record.outcome}" if record.outcome else "it has no result"
        raise UserError(f"--trial {number}: {what}; only a complete trial can be evaluated")
    return record


def _best_picks(request: EvaluateRequest, opened: OpenedStudy) -> tuple[Chooser, str]:
    """Best's pick under the constraints the search measured, then, while the task's own constraints (flips,
    recovery) reject each one evaluated, the next in best's order."""
    settings = opened.settings
    later = {metric.name for metric in after_search()}
    searched = [c for c in request.constraints if c.metric not in later and c not in settings.feasibility]
    on_task = [c for c in request.constraints if c.metric in later]
    before = [*settings.feasibility, *searched]
    first = pick(opened.records, before, request.goal, settings.objective_metrics)
    if first.chosen is None:
        raise NothingSatisfiesError(first.why_none())

    def chosen(now: OpenedStudy) -> Sequence[TrialRecord]:
        candidates: list[TrialRecord] = []
        for record in ranked(now.records, before, request.goal, settings.objective_metrics):
            candidates.append(record)
            if not on_task or not failed(on_task, record.metrics):
                break  # best picks it: nothing after it is asked for
        return candidates

    asked = ", ".join(c.label for c in request.constraints) or "no constraints"
    return chosen, f"best's pick ({request.goal}; {asked})"
