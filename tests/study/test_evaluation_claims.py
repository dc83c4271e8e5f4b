"""Claims on the finalists' evaluations (autotune.study.claims.Evaluations), on real SQLite and PostgreSQL databases:
exactly one of several processes racing for an evaluation takes it; a dead process's evaluation, or one whose
heartbeat went stale, is given back by recovery and taken by the next process once; one taken over is no longer its
first process's to store."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autotune import study as studies
from autotune.study.claims import DONE, FAILED, INTERRUPTED, RUNNING, Claims, Evaluations
from autotune.study.recovery import Heartbeat, Recovery
from tests.postgres import postgres_url  # noqa: F401 - a fixture

TAKE = """
import sys
from autotune import study as studies
from autotune.study.claims import Claims, Evaluations
storage = studies.open_storage(sys.argv[1])
claims = Claims(storage.engine, storage.get_study_id_from_name(sys.argv[2]))
sys.stdin.readline()  # every process is ready: go
print(Evaluations(claims).take(int(sys.argv[3]), token=int(sys.argv[4])))
"""


def take_in_processes(url: str, study: str, number: int, tokens: range) -> list[str]:
    """Each token's process takes the evaluation of trial `number` at once; what each answered. They have ended."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", TAKE, url, study, str(number), str(token)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for token in tokens
    ]
    time.sleep(0.5)  # each imports and connects; then all go at once
    outputs = [process.communicate("go\n", timeout=120) for process in processes]
    assert [process.returncode for process in processes] == [0] * len(processes), [err for _, err in outputs]
    return [out.strip() for out, _ in outputs]


def evaluations_of(url: str, name: str = "evaluated") -> tuple[Evaluations, Claims, optuna.Study]:
    storage = studies.open_storage(url)
    study = optuna.create_study(study_name=name, storage=storage, load_if_exists=True)
    claims = Claims(storage.engine, storage.get_study_id_from_name(name))
    return Evaluations(claims), claims, study


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/s.db"
    return request.getfixturevalue("postgres_url")  # the session's server: a study name of the test's own


def test_of_processes_racing_for_an_evaluation_exactly_one_takes_it(url):
    name = f"race-{time.monotonic_ns()}"
    evaluations_of(url, name)  # the study and the claims' tables exist before the race
    assert sorted(take_in_processes(url, name, 5, range(1, 7))) == ["False"] * 5 + ["True"]


def test_a_dead_processs_evaluation_is_given_back_and_taken_by_the_next_once(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    evaluations, claims, study = evaluations_of(url)
    assert take_in_processes(url, "evaluated", 3, range(1, 2)) == ["True"]  # that process has exited since
    assert evaluations.claims()[3].state == RUNNING
    notes: list[str] = []
    Recovery(study, claims, tmp_path, lambda *_: None, notes.append)()
    assert evaluations.claims()[3].state == INTERRUPTED and evaluations.claims()[3].free
    assert any("evaluations on the task of trials #3 were interrupted" in note for note in notes)
    assert not evaluations.end(3, token=1, state=DONE)  # no longer the dead process's
    assert evaluations.take(3, token=2) and not evaluations.take(3, token=9)
    assert evaluations.claims()[3].attempts == 2
    assert evaluations.end(3, token=2, state=INTERRUPTED)  # interrupted again (a signal): given up
    assert evaluations.claims()[3].given_up and not evaluations.take(3, token=3)
    assert evaluations.take(3, token=4, again=True)  # `autotune evaluate --trial 3` asks for it all the same


def test_an_evaluation_whose_heartbeat_went_stale_is_given_back_and_one_beating_is_not(tmp_path):
    evaluations, _, _ = evaluations_of(f"sqlite:///{tmp_path}/s.db")
    assert evaluations.take(1, token=1) and evaluations.take(2, token=2)
    with Heartbeat(lambda: evaluations.beat(2, token=2), 0.2, "the evaluation of trial #2"):
        time.sleep(2.5)  # past a grace of 1 s (SQLite's clock counts whole seconds) for the silent one
        assert evaluations.recover(grace_s=1.0) == [1]
    states = {number: claim.state for number, claim in evaluations.claims().items()}
    assert states == {1: INTERRUPTED, 2: RUNNING}


def test_a_live_processs_evaluation_is_left_running_and_a_failed_one_is_taken_only_when_asked_again(tmp_path):
    evaluations, _, _ = evaluations_of(f"sqlite:///{tmp_path}/s.db")
    assert evaluations.take(1, token=1)
    assert evaluations.recover(grace_s=60.0) == []
    assert evaluations.holds(1, token=1) and not evaluations.holds(1, token=2)
    assert evaluations.end(1, token=1, state=FAILED)
    assert not evaluations.take(1, token=2)  # a failed evaluation is not retried by a search or a worker
    assert evaluations.take(1, token=2, again=True)


def test_an_evaluation_the_budget_stopped_is_forgotten_with_no_attempt_counted(tmp_path):
    evaluations, _, _ = evaluations_of(f"sqlite:///{tmp_path}/s.db")
    assert evaluations.take(4, token=1)
    evaluations.give_back(4, token=1)
    assert 4 not in evaluations.claims()
    assert evaluations.take(4, token=2) and evaluations.claims()[4].attempts == 1
