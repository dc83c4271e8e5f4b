"""Trials left RUNNING by a process that died (autotune.study.recovery), in a real SQLite Optuna study.

The dead owner is a real process that has exited; its trial's reason and log are in test_optuna_tools.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune import study as studies
from autotune.space import config_key
from autotune.study.claims import OWNER_ATTR, Claims, claim_configuration, owner_alive, this_process
from autotune.study.recovery import Heartbeat, Recovery, _fail_and_retry, recover_interrupted
from tests.fakes import BASELINE, new_study


def dead_owner() -> dict[str, Any]:
    """This host and start time, with the pid of a process that has exited."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return {**this_process(), "pid": process.pid}


def start_trial(study: optuna.Study, claims: Claims, owner: dict[str, Any]) -> int:
    """A trial the way a search runs it: its configuration claimed, its owner recorded; its number."""
    trial = study.ask()  # takes a waiting retry first, as a search does
    key = config_key(BASELINE)
    trial.set_user_attr("config", BASELINE)
    trial.set_user_attr("config_key", key)
    trial.set_user_attr(OWNER_ATTR, owner)
    claims.claim(key, trial.number)
    return trial.number


def reopened(path: Path) -> tuple[optuna.Study, Claims]:
    """The study as the next search opens it, from the file."""
    storage = studies.open_storage(f"sqlite:///{path}")
    study = optuna.load_study(study_name="fake", storage=storage)
    return study, Claims(storage.engine, study._study_id)


def retries_of(study: optuna.Study, number: int) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if t.system_attrs.get("failed_trial") == number]


def test_a_dead_processs_trial_is_failed_its_configuration_given_back_and_queued_again(tmp_path):
    new_study(tmp_path / "s.db")
    study, claims = reopened(tmp_path / "s.db")
    number = start_trial(study, claims, dead_owner())

    study, claims = reopened(tmp_path / "s.db")
    assert recover_interrupted(study, claims) == [number]
    assert study.get_trials(deepcopy=False)[number].state == TrialState.FAIL
    assert claims.holder(config_key(BASELINE)) is None  # the configuration is free to be measured again
    (retry,) = retries_of(study, number)
    assert retry.state == TrialState.WAITING and retry.user_attrs["config"] == BASELINE


def test_a_popped_retry_is_not_failed_as_the_dead_process_s_trial_before_its_new_owner_is_written(tmp_path):
    """A retry carries the interrupted trial's attributes, but not the process that ran it: a worker pops it (RUNNING)
    and writes itself as its owner a moment later; meanwhile another worker's recovery took the copied owner, dead,
    for the retry's and failed it (seen in a fresh-clone .ci/run: the popping worker's next write raised
    UpdateFinishedTrialError and the worker exited with a traceback)."""
    new_study(tmp_path / "s.db")
    study, claims = reopened(tmp_path / "s.db")
    number = start_trial(study, claims, dead_owner())
    study._storage.set_trial_user_attr(study.trials[number]._trial_id, "worker_pid", 1)  # its trial worker's
    study, claims = reopened(tmp_path / "s.db")
    recover_interrupted(study, claims)
    (retry,) = retries_of(study, number)
    assert OWNER_ATTR not in retry.user_attrs and "worker_pid" not in retry.user_attrs

    popped = study.ask()  # a worker takes the retry; its owner is not written yet
    assert popped.number == retry.number
    study, claims = reopened(tmp_path / "s.db")
    recover_interrupted(study, claims)  # another worker's, on the same host
    assert study.get_trials(deepcopy=False)[popped.number].state == TrialState.RUNNING


def test_recovering_again_queues_no_second_retry(tmp_path):
    new_study(tmp_path / "s.db")
    study, claims = reopened(tmp_path / "s.db")
    number = start_trial(study, claims, dead_owner())
    for _ in range(2):  # two later searches, one after the other
        study, claims = reopened(tmp_path / "s.db")
        recover_interrupted(study, claims)
    assert len(retries_of(study, number)) == 1


def test_a_retry_that_is_interrupted_too_is_not_retried_again(tmp_path):
    new_study(tmp_path / "s.db")
    study, claims = reopened(tmp_path / "s.db")
    first = start_trial(study, claims, dead_owner())
    study, claims = reopened(tmp_path / "s.db")
    recover_interrupted(study, claims)
    retry = start_trial(study, claims, dead_owner())
    assert retries_of(study, first)[0].number == retry

    study, claims = reopened(tmp_path / "s.db")
    assert recover_interrupted(study, claims) == []
    trials = study.get_trials(deepcopy=False)
    assert trials[retry].state == TrialState.FAIL
    assert not [t for t in trials if t.state == TrialState.WAITING], "the configuration was queued a second time"
    (record,) = [r for r in studies.records(study) if r.number == retry]
    assert record.interrupted and record.config == BASELINE


def test_recovery_between_trials_tells_of_each_interrupted_trial_once_and_hands_over_the_trials_after(tmp_path):
    new_study(tmp_path / "s.db")
    study, claims = reopened(tmp_path / "s.db")
    number = start_trial(study, claims, dead_owner())
    study, claims = reopened(tmp_path / "s.db")
    notes: list[str] = []
    recovery = Recovery(study, claims, tmp_path / "s", lambda storage, trial_id, number: None, notes.append)
    trials = recovery()
    assert notes == [f"trials #{number} were interrupted when their process died; each is retried once"]
    assert [trial.state for trial in trials] == [TrialState.FAIL, TrialState.WAITING]  # the retry queued
    recovery()
    assert len(notes) == 1, "an interrupted trial is told of once per run"


def test_a_trial_whose_process_still_runs_is_left_running(tmp_path):
    new_study(tmp_path / "s.db")
    study, claims = reopened(tmp_path / "s.db")
    number = start_trial(study, claims, this_process())
    study, claims = reopened(tmp_path / "s.db")
    assert recover_interrupted(study, claims) == []
    assert study.get_trials(deepcopy=False)[number].state == TrialState.RUNNING
    assert claims.holder(config_key(BASELINE)) == number


def test_an_owner_is_alive_only_while_that_very_process_runs():
    me = this_process()
    assert owner_alive(me)
    assert not owner_alive({**me, "started": me["started"] - 60})  # the pid was reused by another process
    assert not owner_alive(dead_owner())
    assert not owner_alive({})


def test_a_retry_asked_before_recovery_releases_the_claim_takes_the_claim_over(tmp_path):
    """Recovery queues the retry, then releases the claim: another search may ask the retry in between."""
    new_study(tmp_path / "s.db")
    study, claims = reopened(tmp_path / "s.db")
    number = start_trial(study, claims, dead_owner())
    storage = studies.open_storage(f"sqlite:///{tmp_path / 's.db'}")
    _fail_and_retry(storage, study, number, None)  # failed and its retry queued; the claim not yet released
    assert claims.holder(config_key(BASELINE)) == number

    retry = study.ask()
    assert retry.number == retries_of(study, number)[0].number
    assert claim_configuration(study, claims, config_key(BASELINE), retry.number) == retry.number
    assert claims.holder(config_key(BASELINE)) == retry.number


def test_a_live_trials_claim_is_not_taken_over(tmp_path):
    new_study(tmp_path / "s.db")
    study, claims = reopened(tmp_path / "s.db")
    number = start_trial(study, claims, this_process())
    other = study.ask()
    assert claim_configuration(study, claims, config_key(BASELINE), other.number) == number


def test_a_heartbeat_thread_keeps_a_trial_alive_through_a_long_blocking_call(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db", heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(study_name="beats", storage=storage)
    beating, silent = study.ask(), study.ask()
    storage.record_heartbeat(silent._trial_id)  # beats once, as a trial loop that blocks does
    with Heartbeat.of_trial(storage, beating._trial_id, every_s=0.1):
        time.sleep(4.0)  # longer than the grace period: a fork server starting on a busy machine
        optuna.storages.fail_stale_trials(study)  # what another worker's recovery runs meanwhile
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states == {beating.number: TrialState.RUNNING, silent.number: TrialState.FAIL}


def test_an_interrupted_configuration_awaits_its_retry_until_the_retry_finishes(tmp_path):
    new_study(tmp_path / "s.db")
    study, claims = reopened(tmp_path / "s.db")
    number = start_trial(study, claims, dead_owner())
    assert studies.awaiting_retry(study) == {}  # running: its own trial holds it

    study, claims = reopened(tmp_path / "s.db")
    recover_interrupted(study, claims)
    assert studies.awaiting_retry(study) == {config_key(BASELINE): number}  # not the planner's nor the sampler's
    assert config_key(BASELINE) not in studies.measured_keys(study)

    retry = start_trial(study, claims, this_process())
    assert studies.awaiting_retry(study) == {config_key(BASELINE): number}
    study.tell(retry, [1.0] * len(study.directions))
    assert studies.awaiting_retry(study) == {}
    assert studies.measured_keys(study)[config_key(BASELINE)] == retry


def test_a_queued_trial_popped_by_two_workers_is_taken_by_the_first_only(tmp_path):
    # On SQLite Optuna reads a WAITING trial outside the transaction that sets it RUNNING, so two workers
    # can both pop it (CI: the second one's suggest() raised UpdateFinishedTrialError once the first skipped it).
    study, _ = new_study(tmp_path / "s.db")
    study.enqueue_trial(BASELINE)
    trial = study.ask()
    first, second = reopened(tmp_path / "s.db")[1], reopened(tmp_path / "s.db")[1]
    assert first.take_trial(trial._trial_id, token=11)
    assert not second.take_trial(trial._trial_id, token=22)
    assert first.take_trial(trial._trial_id, token=11)  # asking again does not lose it
    assert second.take_trial(trial._trial_id + 1, token=22)  # another trial is free to take
