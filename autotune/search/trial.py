"""One trial's life, from the moment Optuna gives it until its result is stored or a signal stops it.

take   asked of Optuna (a queued trial first), marked as this process's with a first heartbeat at once, its
       configuration claimed (study/claims.py), or skipped with why;
run    measured in a worker while a thread records its heartbeat; tests inject a real fault into chosen trials
       (autotune/for_tests.py);
store  its log and result told to the storage; the result is kept on disk until the storage has it (study/kept.py);
retry  an interrupted configuration is measured by its queued retry and by nothing else meanwhile, and never again
       once its retry is interrupted too.

The loop (search/loop.py) decides which trial runs next; the study it decides from is read once per trial
(StudyRead), and what the trial checks before it runs reads that same read; what a failure says of a knob value, the
loop asks search/exclusions.py.
"""

from __future__ import annotations

import time
from collections.abc import Container, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from autotune import for_tests
from autotune import study as studies
from autotune.errors import StorageUnavailableError
from autotune.measure.prepare import trial_spec
from autotune.process import phases
from autotune.process.results import Outcome, TaskResult
from autotune.process.runner import Limits, run_in_worker
from autotune.search.events import SearchEvents
from autotune.search.interrupts import Interrupted, deferred
from autotune.search.session import Session
from autotune.space import Config, Plan, SearchSpace, config_key
from autotune.strategy.durations import Duration
from autotune.study import TrialRecord, artifacts, kept
from autotune.study.claims import OWNER_ATTR, WORKER_PID_ATTR, claim_configuration, this_process
from autotune.study.compile_archives import ARCHIVE_SUFFIX
from autotune.study.optuna_internals import trial_id
from autotune.study.recovery import Heartbeat

HEARTBEAT_EVERY_S = 10.0
SAMPLER = "sampler"  # why a trial ran: Optuna's sampler proposed it


class StudyRead:
    """The study's trials as read once, at the start of a trial's turn: what the loop and the trial decide from.

    It answers `get_trials` as the study did when it was read, so the study's own readers (measured_keys,
    awaiting_retry) work on it without reading the storage again."""

    def __init__(self, trials: list[FrozenTrial]) -> None:
        self.trials = trials
        self.records = [TrialRecord.from_frozen(trial) for trial in trials]

    def get_trials(self, deepcopy: bool = False, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        return [trial for trial in self.trials if states is None or trial.state in states]

    @cached_property
    def measured(self) -> dict[str, int]:
        """Configurations measured, or being measured -> the trial that has them (study.measured_keys)."""
        return studies.measured_keys(self)  # type: ignore[arg-type] - read as the study was

    @cached_property
    def awaiting_retry(self) -> dict[str, int]:
        """Configurations of interrupted trials whose retry is queued or running -> the interrupted trial."""
        return studies.awaiting_retry(self)  # type: ignore[arg-type] - read as the study was

    @cached_property
    def complete(self) -> dict[str, tuple[Config, dict[str, float]]]:
        """Configurations of the trials told complete -> (configuration, figures). A trial whose outcome is stored
        but not yet its figures is not one: another process is storing it (a worker planning its next trial once met
        a kept result half stored: KeyError 'throughput_tok_s')."""
        return {config_key(r.config): (r.config, r.metrics) for r in self.records if r.complete}

    @property
    def waiting(self) -> bool:
        """Whether a trial waits in the queue."""
        return any(trial.state == TrialState.WAITING for trial in self.trials)

    def history(self) -> list[tuple[int, Config, str]]:
        """The trials that ended with an outcome: (number, configuration, outcome)."""
        return [(r.number, r.config, r.outcome) for r in self.records if r.outcome]


@dataclass(frozen=True)
class Measured:
    result: TaskResult
    duration_s: float
    compiles: bool  # its plan compiles (a compile knob), or its worker compiled: its first calls were compiling


class Trial:
    """One trial of a search: taken, run, stored, or abandoned when a signal stops the run."""

    def __init__(self, session: Session, events: SearchEvents) -> None:
        self.session = session
        self.study = session.study
        self.events = events
        self.asked: optuna.Trial | None = None  # None until Optuna gives it
        self.config: Config = {}
        self.roles: list[str] = []  # why it runs: the roles it was queued with, or the sampler's
        self.in_hand = False  # asked and not stored yet: a signal must not leave it RUNNING
        self.started: float | None = None  # when its worker was launched

    @property
    def number(self) -> int:
        assert self.asked is not None
        return self.asked.number

    @property
    def id(self) -> int:
        assert self.asked is not None
        return trial_id(self.asked)

    # ---------------------------------------------------------------------------------------------- take

    def take(self, token: int, space: SearchSpace) -> None:
        """Ask Optuna for a trial, marked as ours with a first heartbeat at once, so a crash can never leave it
        RUNNING; then its configuration. `token`: the loop's own, in the queued trials it pops."""
        for_tests.hold("ask")
        with deferred():
            asked = self.study.ask()
            while not self.session.claims.take_trial(trial_id(asked), token):
                self.events.note(f"trial #{asked.number} was popped by another worker as well; it is theirs")
                asked = self.study.ask()
            self.asked, self.in_hand = asked, True
            asked.set_user_attr(OWNER_ATTR, this_process())
            if self.session.request.run_id:
                asked.set_user_attr("run_id", self.session.request.run_id)
            self.session.patient_storage.first_heartbeat(trial_id(asked))
        self.config = space.suggest(asked)

    def claim(self) -> str | None:
        """Claim the configuration for this trial; why not, when another trial holds it."""
        for_tests.hold("claim")
        holder = claim_configuration(self.study, self.session.claims, config_key(self.config), self.number)
        return None if holder == self.number else f"same configuration as trial #{holder}"

    def release(self) -> None:
        """Give the configuration back: this trial does not measure it."""
        self.session.claims.release(config_key(self.config), self.number)

    def skip(self, reason: str) -> None:
        studies.record_skip(self.study, self.asked, self.config, reason)  # type: ignore[arg-type] - taken

    def queued_roles(self) -> list[str]:
        """Why it runs, as it was queued (the sampler's, when it was not), and "retry" when it retries a trial."""
        assert self.asked is not None
        roles = list(self.asked.user_attrs.get("roles", [SAMPLER]))
        if self.failed_trial is not None and "retry" not in roles:
            roles.append("retry")
        return roles

    # --------------------------------------------------------------------------------------------- retry

    def why_not_run(self, read: StudyRead) -> str | None:
        """Why this trial does not measure its configuration: given up, left to its retry, or claimed already."""
        return self._given_up(read) or self._left_to_retry(read) or self.claim()

    def _given_up(self, read: StudyRead) -> str | None:
        """A configuration interrupted again after its one retry is never run again (it holds no claim)."""
        holder = read.measured.get(config_key(self.config))
        interrupted = holder is not None and read.records[holder].interrupted
        return f"interrupted twice, last as trial #{holder}: not run again" if interrupted else None

    def _left_to_retry(self, read: StudyRead) -> str | None:
        """An interrupted configuration is measured by its queued retry, not by a trial sampled meanwhile."""
        interrupted = read.awaiting_retry.get(config_key(self.config))
        if interrupted is None or self.failed_trial == interrupted:
            return None
        return f"interrupted as trial #{interrupted}: its queued retry measures it"

    def retries(self, read: StudyRead) -> bool:
        """Whether it is the queued retry its configuration awaits."""
        interrupted = read.awaiting_retry.get(config_key(self.config))
        return interrupted is not None and self.failed_trial == interrupted

    @cached_property
    def failed_trial(self) -> int | None:
        """The interrupted trial this one retries, when Optuna's retry callback queued it."""
        return self.session.patient_storage.get_trial(self.id).system_attrs.get("failed_trial")

    # ----------------------------------------------------------------------------------------------- run

    def run(
        self,
        plan: Plan,
        deadline: float | None,
        launch_index: int,
        forecast: Duration,
        records: Sequence[TrialRecord] = (),
    ) -> Measured:
        """Launch it in a worker under a heartbeat, then store what it measured. `plan`: its configuration's, as the
        loop built it; `launch_index`: how many trials this process launched before; `forecast`: what the budget
        expects it to take; `records`: the study's trials as last read (whose archives of compiled code the worker
        loads first)."""
        assert self.asked is not None
        asked, session, request = self.asked, self.session, self.session.request
        self.events.trial_started(self.number, self.config, self.roles)
        studies.record_launch(asked, self.config, plan, self.roles)
        _record_forecast(asked, forecast)
        spec = trial_spec(request, session.prepared, self.config, plan)
        spec.fault = for_tests.fault_for(launch_index, self.config)
        workdir = session.trial_workdir(self.number)
        archive = workdir / f"trial-{self.number:04d}{ARCHIVE_SUFFIX}"  # what it compiles anew, stored with the study
        spec.compile_cache = session.compile_archives.spec(records, archive)
        limits = Limits(request.budget.trial_timeout_s, deadline)
        on_start = lambda pid: asked.set_user_attr(WORKER_PID_ATTR, pid)  # noqa: E731 - which process measures it
        on_phase = lambda name: self.events.progress(f"trial #{asked.number}: {phases.label(name, plan.compiles)}")  # noqa: E731
        with Heartbeat.of_trial(session.patient_storage, self.id, HEARTBEAT_EVERY_S):
            started = self.started = time.monotonic()
            result = run_in_worker(spec, workdir, limits, on_start=on_start, on_phase=on_phase)
            duration = time.monotonic() - started
            self._store(result, duration, workdir)
        compiled = result.details.compile
        for note in compiled.notes if compiled else ():
            self.events.note(f"trial #{self.number}: {note}")
        return Measured(result, duration, plan.compiles or bool(compiled and compiled.compiled))

    def record(self) -> TrialRecord:
        """The trial as stored now."""
        return TrialRecord.from_frozen(self.session.patient_storage.get_trial(self.id))

    # --------------------------------------------------------------------------------------------- store

    def _store(self, result: TaskResult, duration: float, workdir: Path) -> None:
        """The trial's log and result into storage. The result is kept on local disk until the storage has it
        (study/kept.py): through an outage the storage waits out, and past it, for the next process to store."""
        assert self.asked is not None
        kept_file = kept.keep(workdir, self.asked, result, duration)
        try:
            with deferred():
                log = workdir / "worker.log"
                artifacts.attach(self.session.artifact_store, self.asked, log, artifacts.LOG_MIMETYPE)
                self.session.compile_archives.store_archive(self.asked, result)
                self._tell(result, duration)
        except StorageUnavailableError as error:
            self.in_hand = False  # not to be recorded as interrupted: its result waits on disk
            raise StorageUnavailableError(f"{error}{kept.kept_note(self.number, kept_file)}") from None
        kept.forget(kept_file)

    def _tell(self, result: TaskResult, duration: float) -> None:
        assert self.asked is not None
        session = self.session
        try:
            studies.record_result(
                self.study, self.asked, result, duration, session.constraints, session.settings.objective_metrics
            )
        except (UpdateFinishedTrialError, ValueError):  # ValueError: Optuna's "Cannot tell a FAIL trial"
            if session.patient_storage.get_trial(self.id).state == TrialState.RUNNING:
                raise
            # this process stalled past the grace period, or its storage was unreachable that long, and another
            # one failed the trial as interrupted: the result goes to the retry that queued, if it still waits
            measured = kept.KeptResult(None, self.number, self.id, result, duration, this_process())
            self.events.note(kept.store(self.study, session.claims, measured) or f"trial #{self.number} is stored")
        self.in_hand = False
        if result.outcome == Outcome.BUDGET:
            self.release()  # never measured: a later run may take it

    # ----------------------------------------------------------------------------------------- abandoned

    def abandon(self, interrupt: Interrupted) -> None:
        """A signal stopped the run: finish this trial if it is still in hand, so that none is left RUNNING.

        A launched trial (its worker and children already killed by the runner) fails with the reason
        `interrupted` and is queued to be retried once; one not launched yet is recorded as skipped.
        """
        if not self.in_hand or self.asked is None:
            return
        self.in_hand = False
        patient_storage = self.session.patient_storage
        unfinished = patient_storage.get_trial(self.id)  # as it was launched: what the retry copies
        if unfinished.state != TrialState.RUNNING:  # skipped before the signal came
            return
        config = unfinished.user_attrs.get("config") or dict(unfinished.params)
        if self.started is None:
            self.session.claims.release(config_key(config), self.number)
            studies.record_skip(self.study, self.asked, config, f"interrupted by {interrupt} before launch")
            return
        message = f"interrupted by {interrupt}: the search or worker was stopped; retried once when it resumes"
        result = TaskResult(Outcome.INTERRUPTED, message, phase="measure")
        log = self.session.trial_workdir(self.number) / "worker.log"  # as recovery stores it after a SIGKILL
        artifacts.attach(self.session.artifact_store, self.asked, log, artifacts.LOG_MIMETYPE)
        studies.record_result(self.study, self.asked, result, time.monotonic() - self.started)
        retry = patient_storage.get_heartbeat_stale_trial_callback()
        if retry is not None:
            retry(self.study, unfinished)
        self.session.claims.release(config_key(config), self.number)
        interrupt.trial = self.number


def _record_forecast(trial: optuna.Trial, forecast: Duration) -> None:
    """What the budget expected this trial to take, beside what it took (`duration_s`): the forecast checked."""
    if forecast.at_most is not None:  # seconds only once a trial ended; before, no scale
        figures = {"expected": round(forecast.expected, 1), "at_most": round(forecast.at_most, 1)}
        trial.set_user_attr("forecast_s", figures)
