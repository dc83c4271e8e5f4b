"""Results kept on local disk until the storage has them (autotune.study.kept), in a real SQLite study.

The process that kept a result is a real process that has exited; the processes that pick it up at once are real
processes started at the same moment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.process.results import Outcome, TaskResult
from autotune.study import kept
from autotune.study.claims import Claims
from autotune.study.optuna_internals import study_storage, trial_id
from autotune.study.recovery import Recovery, _fail_and_retry, recover_interrupted
from tests.fakes import new_study
from tests.study.test_recovery import dead_owner, reopened, retries_of, start_trial

URL = "sqlite:///{}/s.db"
FIGURES = {"throughput_tok_s": 123.0, "peak_memory_gb": 0.5, "kl_divergence": 0.001}
KEEP_AND_DIE = """
import json, sys
from pathlib import Path
import optuna
from autotune import study as studies
from autotune.process.results import TaskResult
from autotune.study.kept import keep
study = optuna.load_study(study_name="fake", storage=studies.open_storage(sys.argv[1]))
result = TaskResult.from_json(json.loads(sys.argv[4]))
keep(Path(sys.argv[2]), optuna.Trial(study, int(sys.argv[3])), result, 7.5)
"""


def measured() -> TaskResult:
    return TaskResult(Outcome.OK, metrics=FIGURES, timings={"measure": 5.0}, pid=4242)


def kept_by_a_process_that_died(folder: Path, study: optuna.Study, number: int, url: str) -> Path:
    """Keep a result for trial `number` the way a worker does, in a process that then exits."""
    trial = study.get_trials(deepcopy=False)[number]
    result = json.dumps(measured().to_json())
    arguments = [url, str(folder / f"trial-{number:04d}"), str(trial_id(trial)), result]
    subprocess.run([sys.executable, "-c", KEEP_AND_DIE, *arguments], check=True)
    return folder / f"trial-{number:04d}" / kept.KEPT_NAME


def new_running_trial(tmp_path: Path, name: str = "s.db") -> tuple[optuna.Study, Claims, int]:
    new_study(tmp_path / name)
    study, claims = reopened(tmp_path / name)
    return study, claims, start_trial(study, claims, dead_owner())


def test_a_result_its_process_kept_is_stored_by_the_next_one_on_its_trial(tmp_path):
    study, claims, number = new_running_trial(tmp_path)
    path = kept_by_a_process_that_died(tmp_path / "s", study, number, URL.format(tmp_path))

    study, claims = reopened(tmp_path / "s.db")  # the next search or worker
    (line,) = kept.store_kept(study, claims, tmp_path / "s")
    assert line.startswith(f"trial #{number}: the result its process (pid ") and line.endswith("kept on disk is stored")
    stored = study.get_trials(deepcopy=False)[number]
    assert stored.state == TrialState.COMPLETE and stored.values == list(FIGURES.values())
    assert stored.user_attrs["metrics"] == FIGURES and stored.user_attrs["duration_s"] == 7.5
    assert not path.exists() and list(path.parent.glob(f"{kept.KEPT_NAME}*")) == []
    assert recover_interrupted(study, claims) == []  # stored, so not interrupted: nothing to retry
    assert kept.store_kept(study, claims, tmp_path / "s") == []  # and never stored twice


def test_recovery_stores_a_kept_result_before_it_looks_for_interrupted_trials(tmp_path):
    study, claims, number = new_running_trial(tmp_path)
    kept_by_a_process_that_died(tmp_path / "s", study, number, URL.format(tmp_path))

    study, claims = reopened(tmp_path / "s.db")  # the next search or worker, between its trials
    notes: list[str] = []
    trials = Recovery(study, claims, tmp_path / "s", lambda storage, trial_id, number: None, notes.append)()
    (line,) = notes  # the result stored, and no interrupted trial to tell of
    assert line.startswith(f"trial #{number}: the result its process (pid ") and line.endswith("kept on disk is stored")
    assert [trial.state for trial in trials] == [TrialState.COMPLETE]


def test_a_result_its_living_process_keeps_is_left_to_it(tmp_path):
    study, claims, number = new_running_trial(tmp_path)
    trial = optuna.Trial(study, trial_id(study.get_trials(deepcopy=False)[number]))
    path = kept.keep(tmp_path / "s" / f"trial-{number:04d}", trial, measured(), 7.5)
    assert path is not None and kept.store_kept(study, claims, tmp_path / "s") == [] and path.exists()
    assert study.get_trials(deepcopy=False)[number].state == TrialState.RUNNING


PICK_UP = """
import sys, time
from pathlib import Path
import optuna
from autotune import study as studies
from autotune.study.claims import Claims
from autotune.study.kept import store_kept
storage = studies.open_storage(sys.argv[1])
study = optuna.load_study(study_name="fake", storage=storage)
claims = Claims(storage.engine, storage.get_study_id_from_name("fake"), storage.patience)
Path(sys.argv[3]).touch()
while not Path(sys.argv[4]).exists():
    time.sleep(0.01)
for line in store_kept(study, claims, Path(sys.argv[2])):
    print(line)
"""


def test_processes_that_pick_up_a_kept_result_at_the_same_moment_store_it_once(tmp_path):
    study, _, number = new_running_trial(tmp_path)
    kept_by_a_process_that_died(tmp_path / "s", study, number, URL.format(tmp_path))
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{index}" for index in range(4)]
    pickers = [
        subprocess.Popen([sys.executable, "-c", PICK_UP, f"sqlite:///{tmp_path / 's.db'}", str(tmp_path / "s"),
                          str(path), str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for path in ready
    ]  # fmt: skip
    deadline = time.monotonic() + 120
    while not all(path.exists() for path in ready):  # all imported and connected, then all at once
        assert time.monotonic() < deadline and all(p.poll() is None for p in pickers), "a picker never got ready"
        time.sleep(0.05)
    go.touch()
    outputs = [picker.communicate(timeout=120) for picker in pickers]
    assert [picker.returncode for picker in pickers] == [0] * 4, outputs
    lines = [line for stdout, _ in outputs for line in stdout.splitlines()]
    assert len(lines) == 1 and lines[0].endswith("kept on disk is stored"), outputs
    study, _ = reopened(tmp_path / "s.db")
    assert study.get_trials(deepcopy=False)[number].state == TrialState.COMPLETE


def test_a_kept_result_whose_trial_was_failed_as_stale_meanwhile_goes_to_its_waiting_retry(tmp_path):
    study, claims, number = new_running_trial(tmp_path)
    kept_by_a_process_that_died(tmp_path / "s", study, number, URL.format(tmp_path))
    _fail_and_retry(study_storage(study), study, number, None)  # as another worker's heartbeat check does
    (retry,) = retries_of(study, number)

    (line,) = kept.store_kept(study, claims, tmp_path / "s")
    assert line.startswith(f"trial #{number} was failed as interrupted by another process")
    assert line.endswith(f"is stored on its retry, trial #{retry.number}")
    stored = study.get_trials(deepcopy=False)[retry.number]
    assert stored.state == TrialState.COMPLETE and stored.user_attrs["metrics"] == FIGURES
    assert "retry" in stored.user_attrs["roles"]
    assert study.get_trials(deepcopy=False)[number].state == TrialState.FAIL  # as the other worker left it


def test_a_kept_result_whose_retry_runs_already_is_not_stored_twice(tmp_path):
    study, claims, number = new_running_trial(tmp_path)
    kept_by_a_process_that_died(tmp_path / "s", study, number, URL.format(tmp_path))
    _fail_and_retry(study_storage(study), study, number, None)
    (retry,) = retries_of(study, number)
    assert study.ask().number == retry.number  # another worker took the retry: it measures the configuration

    (line,) = kept.store_kept(study, claims, tmp_path / "s")
    assert f"and its retry #{retry.number} measures its configuration" in line and line.endswith(
        "is not stored (that would measure the configuration twice)"
    )
    assert study.get_trials(deepcopy=False)[retry.number].state == TrialState.RUNNING
    assert list((tmp_path / "s").glob(f"trial-*/{kept.KEPT_NAME}*")) == []


def test_a_result_kept_for_a_study_of_the_same_name_in_another_database_is_left_to_it(tmp_path):
    study, claims, number = new_running_trial(tmp_path)
    path = kept_by_a_process_that_died(tmp_path / "s", study, number, URL.format(tmp_path))
    other, other_claims, _ = new_running_trial(tmp_path, "other.db")  # its trial files would go to the same folder
    assert kept.store_kept(other, other_claims, tmp_path / "s") == [] and path.exists()
    assert kept.waiting(other, tmp_path / "s") == set() and kept.waiting(study, tmp_path / "s") == {number}
    assert len(kept.store_kept(study, claims, tmp_path / "s")) == 1 and not path.exists()


def test_a_disk_that_refuses_the_kept_result_leaves_the_storage_its_only_way_out(tmp_path):
    study, _, number = new_running_trial(tmp_path)
    trial = optuna.Trial(study, trial_id(study.get_trials(deepcopy=False)[number]))
    (tmp_path / "file").write_text("")
    assert kept.keep(tmp_path / "file" / "trial-0000", trial, measured(), 1.0) is None  # a file where a folder goes
    assert "could not be kept on disk either" in kept.kept_note(number, None)
