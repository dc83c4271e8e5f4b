"""The trial loop: which trial runs next (the strategy's queue, the sampler, a random pick), whether the budget left
lets it start, and where the search's time went. Each trial's own life (taken, run, stored, retried) is a Trial
(search/trial.py); the loop reads the study once per trial, after recovering what dead processes left."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from autotune import study as studies
from autotune.figures.metrics import FIRST_CALL_S
from autotune.measure.prepare import plan_target
from autotune.process import phases
from autotune.process.results import Outcome, TaskResult
from autotune.search.events import SearchEvents
from autotune.search.exclusions import judge_values
from autotune.search.interrupts import Interrupted, deferred
from autotune.search.session import Session
from autotune.search.trial import SAMPLER, StudyRead, Trial
from autotune.space import Config, Plan, build_plan, config_key, rules
from autotune.strategy.durations import Durations, ended, warm_ended
from autotune.strategy.queue import Situation, next_queued, ruled_out, warm_up_set
from autotune.study import TrialRecord
from autotune.workloads import KINDS

MAX_CONSECUTIVE_SKIPS = 50
RANDOM_PICK = "random pick (the sampler kept proposing measured configurations)"
NEARLY_USED_UP = "budget nearly used up: "


@dataclass
class Spending:
    """Where the wall-clock time of a search went, each share under the name of what it was; and how many of its
    trials compiled cold (at least one graph anew) and warm (every graph found in the study's compile cache)."""

    seconds: dict[str, float] = field(default_factory=dict)
    compiles: dict[str, int] = field(default_factory=dict)  # "cold" / "warm" -> trials

    def add(self, category: str, duration: float) -> None:
        self.seconds[category] = self.seconds.get(category, 0.0) + duration

    def add_trial(self, result: TaskResult, duration: float, compiles: bool) -> None:
        """A trial's time by the phases its worker timed; `compiles`: its plan compiles (a compile knob), or its
        worker compiled something."""
        if result.outcome == Outcome.BUDGET:
            self.add("stopped at the deadline", duration)
            return
        if not result.ok:
            self.add("failed trials", duration)
            return
        compiled = result.details.compile
        if compiled is not None and compiled.compiled:  # counted where its seconds are: the trials that ended ok
            self.compiles[compiled.cache] = self.compiles.get(compiled.cache, 0) + 1
        timed = trial_phases(result, compiles)
        for category, seconds in timed.items():
            self.add(category, seconds)
        self.add(TRIAL_PROCESSES, max(0.0, duration - sum(timed.values())))


TRIAL_PROCESSES = "starting and ending trial processes"  # a trial's time outside the phases its worker timed


def trial_phases(result: TaskResult, compiles: bool) -> dict[str, float]:
    """The phases of a finished trial, named as what they were: the first call of the workload compiles only
    where the plan asks generate() to compile (or the worker compiled); the other warm-up calls are warming up. The
    study's compiled code unpacked before it and archived after it counts as compiling, or as loading where it
    compiled nothing."""
    timings = result.timings
    first_call = _first_calls_s(result)
    archives = timings.get(phases.COMPILE_CACHE, 0.0)
    return {
        "loading models": timings.get("load", 0.0) + timings.get("setup", 0.0) + (0.0 if compiles else archives),
        phases.COMPILING if compiles else "first calls": first_call + (archives if compiles else 0.0),
        "warming up": max(0.0, timings.get("warmup", 0.0) - first_call),
        "measuring": timings.get("measure", 0.0),
        "checking quality": timings.get("quality", 0.0),
    }


def _first_calls_s(result: TaskResult) -> float:
    """The seconds of the workload's first calls: one per batch a capacity probe measured (each compiles anew where
    its shapes are new: 35 s and 48 s of an 8B model's probe on an H100), else the one of its single batch."""
    points = result.details.capacity.points if result.details.capacity else []
    per_point = [point.figures[FIRST_CALL_S] for point in points if FIRST_CALL_S in point.figures]
    return sum(per_point) if per_point else result.metrics.get(FIRST_CALL_S, 0.0)


class TrialLoop:
    """Measures trials until the trial limit, the budget or the space runs out."""

    def __init__(self, session: Session, deadline: float | None, events: SearchEvents) -> None:
        self.session = session
        self.request = session.request
        self.study = session.study
        self.deadline = deadline
        self.events = events
        self.space = studies.space_with_exclusions(session.space, session.study)
        self.spending = Spending()
        self.launched = 0
        self.warm_up = warm_up_set(self.space, session.prepared.baseline_config)
        self.situation = self._situation()
        self.passed_over: dict[str, str] = {}  # why -> what the summary says of a planned trial the budget passed over
        self.current: Trial | None = None  # the last trial taken: a signal must not leave it RUNNING
        self.target = plan_target(session.profile, self.request, session.prepared.traffic)
        self.plans: dict[str, Plan] = {}  # configuration key -> its plan, built once (the checks and the trial read it)
        self.token = random.SystemRandom().randrange(1, 2**31)  # this loop, in the trials it takes

    def run(self) -> str:
        """Measure trials until something stops the search or a signal interrupts it; say what did."""
        try:
            return self._run()
        except Interrupted as interrupt:
            with deferred():
                if self.current is not None:
                    self.current.abandon(interrupt)
            raise

    def _run(self) -> str:
        while True:
            stop = self._limit_reached()
            if stop:
                return stop
            read = StudyRead(self.session.recovery())
            durations = self._durations(read.records)
            trial = self._next_trial(read, durations)
            if trial is None:
                return "every configuration of the space has been measured"
            overrun = self._would_overrun(trial.config, durations)
            if overrun:
                trial.release()
                trial.skip(overrun)
                if not _planned(trial.roles):  # the sampler's proposal: no ranking to take the next from
                    return overrun
                for why in trial.roles:  # queued before its duration was known: the next planned that fits runs
                    self.passed_over.setdefault(why, f"{why} ({overrun.removeprefix(NEARLY_USED_UP)})")
                continue
            result = self._measure(trial, durations, read)
            if result.outcome == Outcome.BUDGET:
                return "budget used up"

    def _limit_reached(self) -> str | None:
        max_trials = self.request.budget.max_trials
        if max_trials is not None and self.launched >= max_trials:
            return f"{self.launched} trials run (--trials {max_trials})"
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "budget used up"
        return None

    def _would_overrun(self, config: Config, durations: Durations) -> str | None:
        """Why this trial must not start: the longest it should take (strategy/durations.py) exceeds the budget left."""
        if self.deadline is None:
            return None
        return overrun_reason(config, durations, self.deadline - time.monotonic())

    def _durations(self, records: list[TrialRecord]) -> Durations:
        workload = self.request.workload
        allowance = KINDS[workload.kind].probe_allowance_s(workload)  # a probe's longer courses
        device = self.session.profile.device_type
        baseline = self.session.prepared.baseline_config
        warm = self.session.compile_archives.expected_warm(records)
        return Durations(ended(records), baseline, device, allowance, warm_ended(records), warm)

    def _next_trial(self, read: StudyRead, durations: Durations) -> Trial | None:
        """The next configuration to measure: queued (anchors, warm-up set, retries) or sampled; None when
        the space has nothing left. Proposals that a rule forbids, that earlier failures rule out, or that
        another trial has claimed are skipped without being run."""
        history = read.history()
        self._queue_planned(read, history, durations)
        for _ in range(MAX_CONSECUTIVE_SKIPS):
            trial = self._take()
            reason = self._never_run(trial.config, history) or trial.why_not_run(read)
            if reason is None:
                trial.roles = trial.queued_roles()
                return trial
            trial.skip(reason)
            if trial.retries(read):  # a retry skipped: its configuration awaits it no longer
                read = StudyRead(self.study.get_trials(deepcopy=False))
        return self._random_pick(read, history, durations)

    def _random_pick(
        self, read: StudyRead, history: list[tuple[int, Config, str]], durations: Durations
    ) -> Trial | None:
        """The sampler keeps proposing known or forbidden configurations: take an untried one at random."""
        seen = read.measured | read.awaiting_retry
        untried = [
            c for c in self.space.configurations() if config_key(c) not in seen and not self._never_run(c, history)
        ]
        if not untried:
            return None
        self.study.enqueue_trial(random.choice(untried), user_attrs={"roles": [RANDOM_PICK]})
        trial = self._take()
        reason = trial.claim()
        if reason is not None:  # another process took it meanwhile
            trial.skip(reason)
            return self._next_trial(StudyRead(self.study.get_trials(deepcopy=False)), durations)
        trial.roles = [RANDOM_PICK]
        return trial

    def _take(self) -> Trial:
        trial = self.current = Trial(self.session, self.events)
        trial.take(self.token, self.space)
        return trial

    def _queue_planned(self, read: StudyRead, history: list[tuple[int, Config, str]], durations: Durations) -> None:
        """Queue what the strategy plans next (warm-up set, compositions, predicted changes), when nothing
        else waits in the queue."""
        if read.waiting:
            return
        taken = set(read.measured) | set(read.awaiting_retry)
        skip = lambda c: self._never_run(c, history)  # noqa: E731
        left = self.deadline - time.monotonic() if self.deadline is not None else None
        passed_over = lambda planned, at_most: self._pass_over(planned.why, at_most, left)  # noqa: E731
        planned = next_queued(self.situation, self.warm_up, read.complete, taken, skip, durations, left, passed_over)
        if planned is not None:
            self.study.enqueue_trial(planned.config, user_attrs={"roles": [planned.why]})

    def _pass_over(self, why: str, at_most: float, left: float | None) -> None:
        """A planned trial the budget left may not finish is not started; the summary says which, and why."""
        self.passed_over.setdefault(why, f"{why} ({_may_take(at_most, left or 0.0)})")

    def _situation(self) -> Situation:
        return Situation(
            self.space,
            self.session.prepared.baseline_config,
            self.session.profile.device_type,
            self.session.settings.objective_metrics,
            self.request.workload.kind,
        )

    def _never_run(self, config: Config, history: list[tuple[int, Config, str]]) -> str | None:
        """Why this configuration is skipped without running: a rule, an earlier failure, or what its workload kind
        cannot measure (serve: a knob `transformers serve` has no flag for)."""
        return self.space.violation(config) or ruled_out(config, history) or self._unmeasurable(config)

    def _unmeasurable(self, config: Config) -> str | None:
        return rules.unmeasurable(self._plan(config))

    def _plan(self, config: Config) -> Plan:
        """The configuration's plan, built once in the search: what checks it before it runs is what its trial runs."""
        key = config_key(config)
        if key not in self.plans:
            self.plans[key] = build_plan(config, self.target)
        return self.plans[key]

    def _measure(self, trial: Trial, durations: Durations, read: StudyRead) -> TaskResult:
        for why in trial.roles:  # passed over earlier, it fits now (more trials alike ended)
            self.passed_over.pop(why, None)
        plan = self._plan(trial.config)
        measured = trial.run(plan, self.deadline, self.launched, durations.of(trial.config), read.records)
        result = measured.result
        self.space = judge_values(self.study, self.session.space, trial.number, trial.config, result)
        if result.blame is not None:
            self.situation = self._situation()
        self.spending.add_trial(result, measured.duration_s, measured.compiles)
        self.launched += 1
        self.events.trial_finished(trial.record())
        return result


def overrun_reason(config: Config, durations: Durations, seconds_left: float) -> str | None:
    """Why a trial of this configuration must not start with this much budget left, or None."""
    at_most = durations.of(config).at_most
    if at_most is not None and at_most > seconds_left:
        return NEARLY_USED_UP + _may_take(at_most, seconds_left)
    return None


def _may_take(at_most: float, seconds_left: float) -> str:
    return f"a trial like this may take up to {at_most:.0f}s and {max(seconds_left, 0.0):.0f}s are left"


def _planned(roles: list[str]) -> bool:
    """Queued by the strategy (or the session's anchors), not proposed by the sampler."""
    return not {SAMPLER, RANDOM_PICK} & set(roles)
