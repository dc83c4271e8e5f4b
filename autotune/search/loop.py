"""The trial loop: ask Optuna for a configuration, claim it, measure it in a worker, tell the result."""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from autotune import study as studies
from autotune.errors import StorageUnavailableError
from autotune.process import phases
from autotune.process.results import Outcome, TaskResult
from autotune.process.runner import Limits, run_in_worker
from autotune.search.durations import Durations, ended
from autotune.search.events import SearchEvents
from autotune.search.interrupts import Interrupted, deferred
from autotune.search.prepare import plan_target, trial_spec
from autotune.search.session import Session
from autotune.search.strategy import Situation, next_queued, ruled_out, warm_up_set
from autotune.space import Config, SearchSpace, build_plan, config_key, rules
from autotune.study import TrialRecord, artifacts, kept
from autotune.study.claims import OWNER_ATTR, claim_configuration, this_process
from autotune.study.optuna_internals import trial_id
from autotune.study.recovery import Heartbeat
from autotune.workloads import KINDS

MAX_CONSECUTIVE_SKIPS = 50
HEARTBEAT_EVERY_S = 10.0
SAMPLER = "sampler"  # why a trial ran: Optuna's sampler proposed it
RANDOM_PICK = "random pick (the sampler kept proposing measured configurations)"
NEARLY_USED_UP = "budget nearly used up: "


@dataclass
class Spending:
    """Where the wall-clock time of a search went, each share under the name of what it was."""

    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, category: str, duration: float) -> None:
        self.seconds[category] = self.seconds.get(category, 0.0) + duration

    def add_trial(self, result: TaskResult, duration: float, compiles: bool) -> None:
        """A trial's time by the phases its worker timed; `compiles`: its plan compiles (a compile knob)."""
        if result.outcome == Outcome.BUDGET:
            self.add("stopped at the deadline", duration)
            return
        if not result.ok:
            self.add("failed trials", duration)
            return
        timed = trial_phases(result, compiles)
        for category, seconds in timed.items():
            self.add(category, seconds)
        self.add(TRIAL_PROCESSES, max(0.0, duration - sum(timed.values())))


TRIAL_PROCESSES = "starting and ending trial processes"  # a trial's time outside the phases its worker timed


def trial_phases(result: TaskResult, compiles: bool) -> dict[str, float]:
    """The phases of a finished trial, named as what they were: the first call of the workload compiles only
    where the plan asks generate() to compile; the other warm-up calls are warming up."""
    timings = result.timings
    first_call = _first_calls_s(result)
    return {
        "loading models": timings.get("load", 0.0) + timings.get("setup", 0.0),
        "compiling (first calls)" if compiles else "first calls": first_call,
        "warming up": max(0.0, timings.get("warmup", 0.0) - first_call),
        "measuring": timings.get("measure", 0.0),
        "checking quality": timings.get("quality", 0.0),
    }


def _first_calls_s(result: TaskResult) -> float:
    """The seconds of the workload's first calls: one per batch a capacity probe measured (each compiles anew where
    its shapes are new: 35 s and 48 s of an 8B model's probe on an H100), else the one of its single batch."""
    points = (result.details.capacity or {}).get("points", [])
    per_point = [point["figures"]["first_call_s"] for point in points if "first_call_s" in point.get("figures", {})]
    return sum(per_point) if per_point else result.metrics.get("first_call_s", 0.0)


class TrialLoop:
    """Measures trials until the trial limit, the budget or the space runs out."""

    def __init__(self, session: Session, deadline: float | None, events: SearchEvents) -> None:
        self.session = session
        self.request = session.request
        self.study = session.study
        self.prepared = session.prepared
        self.deadline = deadline
        self.events = events
        self.claims = session.claims
        self.space = studies.space_with_exclusions(session.space, session.study)
        self.spending = Spending()
        self.launched = 0
        self.warm_up = warm_up_set(self.space, session.prepared.baseline_config)
        self.situation = self._situation()
        self.passed_over: dict[
            str, str
        ] = {}  # why -> what the summary says of a trial the budget left could not finish
        self.current: optuna.Trial | None = None  # asked and not finished yet: a signal must not leave it RUNNING
        self.started: float | None = None  # when the current trial's worker was launched
        self.token = random.SystemRandom().randrange(1, 2**31)  # this loop, in the trials it takes

    def run(self) -> str:
        """Measure trials until something stops the search or a signal interrupts it; say what did."""
        try:
            return self._run()
        except Interrupted as interrupt:
            with deferred():
                self._abandon(interrupt)
            raise

    def _run(self) -> str:
        while True:
            stop = self._limit_reached()
            if stop:
                return stop
            self.session.recovery()
            picked = self._next_trial()
            if picked is None:
                return "every configuration of the space has been measured"
            trial, config, roles = picked
            overrun = self._would_overrun(config)
            if overrun:
                self._release(config, trial.number)
                studies.record_skip(self.study, trial, config, overrun)
                if not _planned(roles):  # the sampler's proposal: no ranking to take the next from
                    return overrun
                for why in roles:  # queued before its duration was known: the next planned that fits runs
                    self.passed_over.setdefault(why, f"{why} ({overrun.removeprefix(NEARLY_USED_UP)})")
                continue
            result = self._measure(trial, config, roles)
            if result.outcome == Outcome.BUDGET:
                return "budget used up"

    def _limit_reached(self) -> str | None:
        max_trials = self.request.budget.max_trials
        if max_trials is not None and self.launched >= max_trials:
            return f"{self.launched} trials run (--trials {max_trials})"
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "budget used up"
        return None

    def _would_overrun(self, config: Config) -> str | None:
        """Why this trial must not start: the longest it should take (search/durations.py) exceeds the budget left."""
        if self.deadline is None:
            return None
        return overrun_reason(config, self._durations(studies.records(self.study)), self.deadline - time.monotonic())

    def _durations(self, records: list[TrialRecord]) -> Durations:
        workload = self.request.workload
        allowance = KINDS[workload.kind].probe_allowance_s(workload)  # a probe's longer courses
        device = self.session.profile.device_type
        return Durations(ended(records), self.prepared.baseline_config, device, allowance)  # type: ignore[arg-type]

    def _next_trial(self) -> tuple[optuna.Trial, Config, list[str]] | None:
        """The next configuration to measure: queued (anchors, warm-up set, retries) or sampled; None when
        the space has nothing left. Proposals that a rule forbids, that earlier failures rule out, or that
        another trial has claimed are skipped without being run."""
        records = studies.records(self.study)
        history = [(r.number, r.config, r.outcome) for r in records if r.outcome]
        self._queue_planned(records, history)
        for _ in range(MAX_CONSECUTIVE_SKIPS):
            trial = self._ask()
            config = self.space.suggest(trial)
            reason = (
                self._never_run(config, history)
                or self._given_up(config)
                or self._left_to_retry(config, trial)
                or self._claim(config, trial.number)
            )
            if reason is None:
                return trial, config, self._roles(trial)
            studies.record_skip(self.study, trial, config, reason)
        seen = studies.measured_keys(self.study) | studies.awaiting_retry(self.study)
        untried = [
            c for c in self.space.configurations() if config_key(c) not in seen and not self._never_run(c, history)
        ]
        if not untried:
            return None
        # The sampler keeps proposing known or forbidden configurations: take an untried one at random.
        self.study.enqueue_trial(random.choice(untried), user_attrs={"roles": [RANDOM_PICK]})
        trial = self._ask()
        config = self.space.suggest(trial)
        reason = self._claim(config, trial.number)
        if reason is not None:  # another process took it meanwhile
            studies.record_skip(self.study, trial, config, reason)
            return self._next_trial()
        return trial, config, [RANDOM_PICK]

    def _queue_planned(self, records: list[TrialRecord], history: list[tuple[int, Config, str]]) -> None:
        """Queue what the strategy plans next (warm-up set, compositions, predicted changes), when nothing
        else waits in the queue."""
        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if waiting:
            return
        taken = set(studies.measured_keys(self.study)) | set(studies.awaiting_retry(self.study))
        complete = {config_key(r.config): (r.config, r.metrics) for r in records if r.outcome == Outcome.OK}
        skip = lambda c: self._never_run(c, history)  # noqa: E731
        left = self.deadline - time.monotonic() if self.deadline is not None else None
        durations = self._durations(records)
        passed_over = lambda planned, at_most: self._pass_over(planned.why, at_most, left)  # noqa: E731
        planned = next_queued(self.situation, self.warm_up, complete, taken, skip, durations, left, passed_over)
        if planned is not None:
            self.study.enqueue_trial(planned.config, user_attrs={"roles": [planned.why]})

    def _pass_over(self, why: str, at_most: float, left: float | None) -> None:
        """A planned trial the budget left may not finish is not started; the summary says which, and why."""
        self.passed_over.setdefault(why, f"{why} ({_may_take(at_most, left or 0.0)})")

    def _situation(self) -> Situation:
        return Situation(
            self.space,
            self.prepared.baseline_config,
            self.session.profile.device_type,  # type: ignore[arg-type] - "cpu" or "cuda"
            self.session.settings.objective_metrics,
            self.request.workload.kind,
        )

    def _never_run(self, config: Config, history: list[tuple[int, Config, str]]) -> str | None:
        """Why this configuration is skipped without running: a rule, an earlier failure, or what its workload kind
        cannot measure (serve: a knob `transformers serve` has no flag for)."""
        return self.space.violation(config) or ruled_out(config, history) or self._unmeasurable(config)

    def _unmeasurable(self, config: Config) -> str | None:
        return rules.unmeasurable(build_plan(config, plan_target(self.session.profile, self.request)))

    def _ask(self) -> optuna.Trial:
        """A new trial, marked as ours with a first heartbeat at once, so a crash can never leave it RUNNING."""
        with deferred():
            trial = self.study.ask()
            while not self.claims.take_trial(trial_id(trial), self.token):
                self.events.note(f"trial #{trial.number} was popped by another worker as well; it is theirs")
                trial = self.study.ask()
            self.current = trial
            self.started = None
            trial.set_user_attr(OWNER_ATTR, this_process())
            if self.request.run_id:
                trial.set_user_attr("run_id", self.request.run_id)
            self.session.storage.first_heartbeat(trial_id(trial))
        return trial

    def _roles(self, trial: optuna.Trial) -> list[str]:
        roles = list(trial.user_attrs.get("roles", [SAMPLER]))
        if self._failed_trial(trial) is not None and "retry" not in roles:
            roles.append("retry")
        return roles

    def _given_up(self, config: Config) -> str | None:
        """A configuration interrupted again after its one retry is never run again (it holds no claim)."""
        holder = studies.measured_keys(self.study).get(config_key(config))
        trials = self.study.get_trials(deepcopy=False)
        interrupted = holder is not None and TrialRecord.from_frozen(trials[holder]).interrupted
        return f"interrupted twice, last as trial #{holder}: not run again" if interrupted else None

    def _left_to_retry(self, config: Config, trial: optuna.Trial) -> str | None:
        """An interrupted configuration is measured by its queued retry, not by a trial sampled meanwhile."""
        interrupted = studies.awaiting_retry(self.study).get(config_key(config))
        if interrupted is None or self._failed_trial(trial) == interrupted:
            return None
        return f"interrupted as trial #{interrupted}: its queued retry measures it"

    def _failed_trial(self, trial: optuna.Trial) -> int | None:
        return self.study.get_trials(deepcopy=False)[trial.number].system_attrs.get("failed_trial")

    def _claim(self, config: Config, number: int) -> str | None:
        holder = claim_configuration(self.study, self.claims, config_key(config), number)
        return None if holder == number else f"same configuration as trial #{holder}"

    def _record_forecast(self, trial: optuna.Trial, config: Config) -> None:
        """What the budget expected this trial to take, beside what it took (`duration_s`): the forecast checked."""
        forecast = self._durations(studies.records(self.study)).of(config)
        if forecast.at_most is not None:  # seconds only once a trial ended; before, no scale
            trial.set_user_attr(
                "forecast_s", {"expected": round(forecast.expected, 1), "at_most": round(forecast.at_most, 1)}
            )

    def _release(self, config: Config, number: int) -> None:
        self.claims.release(config_key(config), number)

    def _measure(self, trial: optuna.Trial, config: Config, roles: list[str]) -> TaskResult:
        self.events.trial_started(trial.number, config, roles)
        for why in roles:  # passed over earlier, it fits now (more trials alike ended)
            self.passed_over.pop(why, None)
        built = build_plan(config, plan_target(self.session.profile, self.request))
        studies.record_launch(trial, config, built.to_json(), roles)
        self._record_forecast(trial, config)
        spec = trial_spec(self.request, self.prepared, config, built.to_json())
        if (fault := _injected_fault(self.launched, config)) is not None:
            spec.fault = fault
        workdir = self.session.trial_workdir(trial.number)
        limits = Limits(self.request.budget.trial_timeout_s, self.deadline)
        on_start = lambda pid: trial.set_user_attr("worker_pid", pid)  # noqa: E731 - which process measures it
        compiles = built.compiles
        on_phase = lambda name: self.events.progress(f"trial #{trial.number}: {phases.label(name, compiles)}")  # noqa: E731
        with Heartbeat(self.session.storage, trial_id(trial), HEARTBEAT_EVERY_S):
            started = self.started = time.monotonic()
            result = run_in_worker(spec, workdir, limits, on_start=on_start, on_phase=on_phase)
            duration = time.monotonic() - started
            self._store(trial, config, result, duration, workdir)
        self.space = judge_values(self.study, self.session.space, trial.number, config, result)
        if result.excludes or result.suspects:
            self.situation = self._situation()
        self.spending.add_trial(result, duration, compiles)
        self.launched += 1
        self.events.trial_finished(TrialRecord.from_frozen(self.study.get_trials(deepcopy=False)[trial.number]))
        return result

    def _store(self, trial: optuna.Trial, config: Config, result: TaskResult, duration: float, workdir: Path) -> None:
        """The trial's log and result into storage. The result is kept on local disk until the storage has it
        (study/kept.py): through an outage the storage waits out, and past it, for the next process to store."""
        kept_file = kept.keep(workdir, trial, result, duration)
        try:
            with deferred():
                artifacts.attach(self.session.artifact_store, trial, workdir / "worker.log", artifacts.LOG_MIMETYPE)
                self._record(trial, config, result, duration)
        except StorageUnavailableError as error:
            self.current = None  # not to be recorded as interrupted: its result waits on disk
            raise StorageUnavailableError(f"{error}{kept.kept_note(trial.number, kept_file)}") from None
        kept.forget(kept_file)

    def _record(self, trial: optuna.Trial, config: Config, result: TaskResult, duration: float) -> None:
        try:
            studies.record_result(
                self.study, trial, result, duration, self.session.constraints, self.session.settings.objective_metrics
            )
        except (UpdateFinishedTrialError, ValueError):  # ValueError: Optuna's "Cannot tell a FAIL trial"
            if self.session.storage.get_trial(trial_id(trial)).state == TrialState.RUNNING:
                raise
            # this process stalled past the grace period, or its storage was unreachable that long, and another
            # one failed the trial as interrupted: the result goes to the retry that queued, if it still waits
            measured = kept.KeptResult(None, trial.number, trial_id(trial), result, duration, this_process())
            self.events.note(kept.store(self.study, self.claims, measured) or f"trial #{trial.number} is stored")
        self.current = None
        if result.outcome == Outcome.BUDGET:
            self._release(config, trial.number)  # never measured: a later run may take it

    def _abandon(self, interrupt: Interrupted) -> None:
        """A signal stopped the run: finish the trial in hand, so that none is left RUNNING.

        A launched trial (its worker and children already killed by the runner) fails with the reason
        `interrupted` and is queued to be retried once; one not launched yet is recorded as skipped.
        """
        trial, self.current = self.current, None
        if trial is None:
            return
        storage = self.session.storage
        unfinished = storage.get_trial(trial_id(trial))  # as it was launched: what the retry copies
        if unfinished.state != TrialState.RUNNING:  # skipped before the signal came
            return
        config = unfinished.user_attrs.get("config") or dict(unfinished.params)
        if self.started is None:
            self._release(config, trial.number)
            studies.record_skip(self.study, trial, config, f"interrupted by {interrupt} before launch")
            return
        message = f"interrupted by {interrupt}: the search or worker was stopped; retried once when it resumes"
        result = TaskResult(Outcome.INTERRUPTED, message, phase="measure")
        log = self.session.trial_workdir(trial.number) / "worker.log"  # as recovery stores it after a SIGKILL
        artifacts.attach(self.session.artifact_store, trial, log, artifacts.LOG_MIMETYPE)
        studies.record_result(self.study, trial, result, time.monotonic() - self.started)
        retry = storage.get_heartbeat_stale_trial_callback()
        if retry is not None:
            retry(self.study, unfinished)
        self._release(config, trial.number)
        interrupt.trial = trial.number


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


def _injected_fault(launch_index: int, config: Config) -> dict[str, str] | None:
    """Tests make a trial fail for real: the n-th trial this process launches (from 0), or every trial of the
    configurations that have all the knob values a key names, whichever trial launches them.

    AUTOTUNE_INJECT_FAULTS='{"3": {"phase": "load", "kind": "hang"}}' makes the fourth trial hang while loading;
    '{"dtype=float32,attn_implementation=eager": {"phase": "load", "kind": "raise"}}' makes every float32 eager
    trial raise while loading.
    """
    faults = os.environ.get("AUTOTUNE_INJECT_FAULTS")
    if not faults:
        return None
    for key, fault in json.loads(faults).items():
        if key == str(launch_index) or ("=" in key and _has_values(config, key)):
            return fault
    return None


def _has_values(config: Config, pairs: str) -> bool:
    """Whether `config` has every value of "knob=value,knob=value"."""
    return all(str(config.get(knob)) == value for knob, _, value in (pair.partition("=") for pair in pairs.split(",")))


def judge_values(
    study: optuna.Study, declared: SearchSpace, number: int, config: Config, result: TaskResult
) -> SearchSpace:
    """What a trial's result says of its values; the space left to search.

    A typed refusal excludes its value for the study. A value only the words of an error point at is suspected,
    and excluded when a trial of another configuration fails on it too; a trial that completes clears the
    suspicion of its values.
    """
    if result.excludes:
        knob, value = result.excludes["knob"], result.excludes["value"]
        studies.add_exclusion(study, knob, value, f"{knob}={value} cannot run here: {_first_line(result.message)}")
    elif result.suspects:
        knob, value = result.suspects["knob"], result.suspects["value"]
        earlier = studies.suspicions(study).get(knob, {}).get(str(value))
        if earlier is None:
            studies.add_suspicion(study, knob, value, number, config_key(config), _first_line(result.message))
        elif earlier["config_key"] != config_key(config):
            why = f"trials #{earlier['trial']} and #{number} failed with words that point at it"
            reason = f"{knob}={value} is suspected twice ({why}): {_first_line(result.message)}"
            studies.add_exclusion(study, knob, value, reason)
    elif result.ok:
        suspected = studies.suspicions(study)
        for knob, value in config.items():
            if str(value) in suspected.get(knob, {}):
                studies.clear_suspicion(study, knob, value)
    return studies.space_with_exclusions(declared, study)


def _first_line(message: str) -> str:
    return message.splitlines()[0] if message else ""
