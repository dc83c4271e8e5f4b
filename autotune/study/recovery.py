"""Trials left RUNNING by a process that died: fail them, give their configuration back, retry once.

A trial records which process runs it (host, pid, process start time: study/claims.py). When that
process is gone (kill -9, a crashed laptop), the next search on the same host fails the trial at once;
trials of other hosts fail when their heartbeat goes stale (Optuna's heartbeat, as in the multi-worker
mode). Either way Optuna's RetryHeartbeatStaleTrialCallback queues the configuration once more. A
failed trial without an outcome is an interrupted one (see study.TrialRecord): Optuna does not let a
finished trial be annotated, so its one-line reason (FAIL_REASON_ATTR) is written just before it fails.

`Recovery` is what a search or a worker does between trials: the results this machine kept on disk
stored first (study/kept.py), then the trials of dead processes failed and retried, and their evaluations on the
study's task (tier 1) given back for the next process free (study/claims.py, Evaluations), by the same signs.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import fail_stale_trials
from optuna.trial import FrozenTrial, TrialState

from autotune.study import FAIL_REASON_ATTR, TrialRecord, interrupted_message, kept
from autotune.study.claims import OWNER_ATTR, Claims, Evaluations, owner_alive
from autotune.study.optuna_internals import heartbeat_enabled, stale_trial_ids, study_id, study_storage
from autotune.study.storage import GRACE_PERIOD_S

log = logging.getLogger(__name__)

# Stores what a trial left behind (its log) before it fails: (storage, trial id, trial number).
LogAttacher = Callable[[optuna.storages.BaseStorage, int, int], None]


@dataclass
class Recovery:
    """What a process of a study recovers between trials, and with what: its study and claims, where this machine
    keeps the study's trial files (kept results, logs), how it stores a log, and where it says what it found."""

    study: optuna.Study
    claims: Claims
    trial_files: Path  # the study's folder of trial folders on this machine (a search's or a worker's workdir)
    attach_log: LogAttacher
    note: Callable[[str], None]
    noted: set[int] = field(default_factory=set)  # the interrupted trials this run has told of already
    grace_s: float = GRACE_PERIOD_S  # an evaluation whose heartbeat is older is its dead process's, as a trial's

    def __call__(self) -> list[FrozenTrial]:
        """Store the results that processes of this machine kept on disk and could not store (study/kept.py), then
        fail and retry the trials of dead processes; the study's trials as they are then (read once).

        Each interrupted trial is noted once per run."""
        for line in kept.store_kept(self.study, self.claims, self.trial_files):
            self.note(line)
        spared = kept.waiting(self.study, self.trial_files)
        retried, trials = _recover(self.study, self.claims, self.attach_log, spared)
        recovered = [number for number in retried if number not in self.noted]
        self.noted.update(recovered)
        if recovered:
            numbers = ", ".join(f"#{number}" for number in recovered)
            self.note(f"trials {numbers} were interrupted when their process died; each is retried once")
        given_back = Evaluations(self.claims).recover(self.grace_s)
        if given_back:
            numbers = ", ".join(f"#{number}" for number in given_back)
            self.note(
                f"the evaluations on the task of trials {numbers} were interrupted when their process died; "
                "the next process free takes each, once"
            )
        return trials


class Heartbeat:
    """A heartbeat (`beat`: a trial's, an evaluation's), recorded on a thread every `every_s` seconds for as long as the
    block runs.

    Beating from the trial loop itself left gaps: one blocking call (a fork server importing torch on a
    busy machine, a lock) could outlast the grace period, and another worker then failed a live trial.
    """

    def __init__(self, beat: Callable[[], None], every_s: float, of: str) -> None:
        self.record, self.every_s, self.of = beat, every_s, of
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name=f"heartbeat of {self.of}", daemon=True)
        self.failing = False  # the last beat could not be recorded: try again every RETRY_S, say so once

    @classmethod
    def of_trial(cls, storage: optuna.storages.BaseStorage, trial_id: int, every_s: float) -> Heartbeat:
        return cls(lambda: storage.record_heartbeat(trial_id), every_s, f"trial id {trial_id}")

    def __enter__(self) -> Heartbeat:
        self._record()
        self.thread.start()
        return self

    def __exit__(
        self, error_type: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stopped.set()
        self.thread.join()

    def _beat(self) -> None:
        while not self.stopped.wait(HEARTBEAT_RETRY_S if self.failing else self.every_s):
            self._record()

    def _record(self) -> None:
        """One beat. While the database is unreachable, beats are retried every second, so the trial's heartbeat
        resumes within a second of its return, before another worker can find it stale."""
        try:
            self.record()
        except Exception as error:  # the database is unreachable, or restarting: the next beat tries again
            if not self.failing:
                log.info("could not record the heartbeat of %s: %s", self.of, _first_line(error))
            self.failing = True
            return
        self.failing = False


HEARTBEAT_RETRY_S = 1.0


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def recover_interrupted(
    study: optuna.Study, claims: Claims, attach_log: LogAttacher | None = None, spared: Set[int] = frozenset()
) -> list[int]:
    """Fail the trials whose process died, queue their retry, release their claims; their numbers.

    `spared`: trials whose measured result another process of this host is storing now (study/kept.py). They are
    not failed, and their heartbeat is recorded, so that no other host's process finds them stale meanwhile.
    """
    return _recover(study, claims, attach_log, spared)[0]


def _recover(
    study: optuna.Study, claims: Claims, attach_log: LogAttacher | None, spared: Set[int]
) -> tuple[list[int], list[FrozenTrial]]:
    """recover_interrupted's numbers, and the study's trials read once after it failed and queued what it did."""
    storage = study_storage(study)
    host = socket.gethostname()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get(OWNER_ATTR)
        if trial.number in spared:
            _beat(storage, claims, storage.get_trial_id_from_study_id_trial_number(study_id(study), trial.number))
        elif owner and owner.get("host") == host and not owner_alive(owner):
            _fail_and_retry(storage, study, trial.number, attach_log)
    _explain_stale(storage, study, attach_log)
    fail_stale_trials(study)  # other hosts' trials, by heartbeat; their retry is queued the same way
    trials = study.get_trials(deepcopy=False)
    interrupted = [record for record in map(TrialRecord.from_frozen, trials) if record.interrupted]
    for record in interrupted:
        claims.release(record.config_key, record.number)
    waiting = [trial for trial in trials if trial.state == TrialState.WAITING]
    return [record.number for record in interrupted if _queued_retry(waiting, record)], trials


def _beat(storage: optuna.storages.BaseStorage, claims: Claims, trial_id: int) -> None:
    """A heartbeat recorded through an outage, with the storage's patience (Claims holds it), as every other call of
    this thread: the storage leaves heartbeats impatient, for the trials' heartbeat threads (study/patience.py)."""
    beat = lambda: storage.record_heartbeat(trial_id)  # noqa: E731
    if claims.patience is None:
        beat()
    else:
        claims.patience.call(beat)


def _fail_and_retry(
    storage: optuna.storages.BaseStorage, study: optuna.Study, number: int, attach_log: LogAttacher | None
) -> None:
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id(study), number)
    try:
        _explain(storage, trial_id, attach_log)
        if not storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
            return
    except UpdateFinishedTrialError:  # another search on this host was faster
        return
    retry = storage.get_heartbeat_stale_trial_callback()
    if retry is not None:
        retry(study, storage.get_trial(trial_id))


def _explain_stale(storage: optuna.storages.RDBStorage, study: optuna.Study, attach_log: LogAttacher | None) -> None:
    """Give the trials that fail_stale_trials is about to fail their reason (Optuna asks none)."""
    if not heartbeat_enabled(storage):
        return
    for trial_id in stale_trial_ids(storage, study):
        try:
            _explain(storage, trial_id, attach_log)
        except UpdateFinishedTrialError:  # it finished meanwhile
            continue


def _explain(storage: optuna.storages.BaseStorage, trial_id: int, attach_log: LogAttacher | None) -> None:
    """Its reason and its log, while it still runs: Optuna lets no finished trial be annotated."""
    trial = storage.get_trial(trial_id)
    storage.set_trial_user_attr(trial_id, FAIL_REASON_ATTR, interrupted_message(trial.user_attrs.get(OWNER_ATTR) or {}))
    if attach_log is not None:
        attach_log(storage, trial_id, trial.number)


def _queued_retry(waiting: list[FrozenTrial], record: TrialRecord) -> bool:
    """Whether this interrupted trial's retry is still waiting (so it is news to report)."""
    return any(
        trial.system_attrs.get("failed_trial") is not None and record.number in trial.system_attrs["retry_history"]
        for trial in waiting
    )
