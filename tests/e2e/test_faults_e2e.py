"""Never lose a trial: real faults inside real searches on the demo model, a killed search, the budget,
and two searches sharing one SQLite study.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest

from autotune.study import open_storage, records
from autotune.worker.demo_model import ensure_demo_model
from tests.conftest import (
    BRIEF,
    EIGHT_CONFIGURATIONS,
    KILLED_SEARCH,
    KilledSearch,
    announced,
    running_trial,
    wait_for,
)

pytestmark = pytest.mark.slow

SMALL = ["--model", "demo", "--gpu", "cpu", "--batch-size", "2", "--input-len", "32", "--output-len", "16", *BRIEF]
# What the hanging trial waits for. A normal trial of SMALL takes about 5 s with the fork server on an idle 2-core
# machine, yet a trial of a larger workload (4 x 64 -> 32) was seen past 25 s at a load average of 5 here.
TRIAL_TIMEOUT = "25s"


@pytest.fixture
def env(cache_dir: Path) -> dict[str, str]:
    ensure_demo_model(cache_dir)  # built once per session, so budgets below measure the search only
    environment = dict(os.environ)
    environment["AUTOTUNE_CACHE_DIR"] = str(cache_dir)
    return environment


def search(workdir: Path, env: dict[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "autotune", "search", *SMALL, *args]
    return subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)


def load(workdir: Path, name: str = "demo-cpu") -> optuna.Study:
    # open_storage: the search may be creating this database's schema right now
    return optuna.load_study(study_name=name, storage=open_storage(f"sqlite:///{workdir}/studies/{name}.db"))


def launched(study: optuna.Study):
    return [record for record in records(study) if record.launched]


# Each of the eight configurations runs once in eight trials: each fault below is attached to a configuration.
REFERENCE = "dtype=float32,attn_implementation=sdpa,execution_mode=no_grad"
BASELINE = "dtype=bfloat16,attn_implementation=sdpa,execution_mode=no_grad"
HANGS = "dtype=bfloat16,attn_implementation=eager,execution_mode=no_grad"
RAISES = "dtype=float32,attn_implementation=eager,execution_mode=no_grad"
RUNS_OUT_OF_MEMORY = "dtype=float32,attn_implementation=sdpa,execution_mode=inference_mode"  # float32 needs the
# most memory of the eight: its out-of-memory rules out no other configuration (strategy.ruled_out)
EXITS = "dtype=bfloat16,attn_implementation=sdpa,execution_mode=inference_mode"
KILLED = "dtype=float32,attn_implementation=eager,execution_mode=inference_mode"  # killed from outside, below, in
# its hang while loading, which every launched trial reaches
NORMAL = "dtype=bfloat16,attn_implementation=eager,execution_mode=inference_mode"
FAULTS = {
    HANGS: {"phase": "load", "kind": "hang"},
    RAISES: {"phase": "load", "kind": "raise"},
    RUNS_OUT_OF_MEMORY: {"phase": "warmup", "kind": "oom"},
    EXITS: {"phase": "measure", "kind": "exit"},
    KILLED: {"phase": "load", "kind": "hang"},
}


def _key(config: dict) -> str:
    return ",".join(f"{knob}={config[knob]}" for knob in ("dtype", "attn_implementation", "execution_mode"))


def test_every_fault_inside_a_trial_is_recorded_and_the_study_goes_on(tmp_path, env):
    (tmp_path / "eight.yaml").write_text(EIGHT_CONFIGURATIONS)
    env = {**env, "AUTOTUNE_INJECT_FAULTS": json.dumps(FAULTS)}
    process = subprocess.Popen(
        [sys.executable, "-m", "autotune", "search", *SMALL, "--space", "eight.yaml", "--trials", "8",
         "--trial-timeout", TRIAL_TIMEOUT],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    killed: list[int] = []

    def kill_the_hanging_trials_worker() -> None:
        while process.poll() is None and not killed:
            trial = running_trial(tmp_path)
            hanging = trial is not None and _key(trial.user_attrs["config"]) == KILLED
            if hanging and announced(tmp_path / "studies" / "demo-cpu", trial.number, "load"):
                os.kill(trial.user_attrs["worker_pid"], signal.SIGKILL)  # in its hang: loading was announced
                killed.append(trial.user_attrs["worker_pid"])
            time.sleep(0.3)

    killer = threading.Thread(target=kill_the_hanging_trials_worker, daemon=True)
    killer.start()
    stdout, stderr = process.communicate(timeout=900)
    assert process.returncode == 0, stdout + stderr
    assert killed, "the test never found the worker to kill"

    runs = {_key(record.config): record for record in launched(load(tmp_path))}
    assert len(runs) == 8 == len(launched(load(tmp_path))), "each of the eight configurations measured once"
    for key in (REFERENCE, BASELINE, NORMAL):  # the study went on with normal trials, whenever they ran
        assert runs[key].outcome == "ok", (key, runs[key].message)
    assert (runs[REFERENCE].roles, runs[BASELINE].roles) == (("reference",), ("baseline",))
    assert (runs[HANGS].outcome, runs[HANGS].phase) == ("timeout", None)
    assert (runs[RAISES].outcome, runs[RAISES].phase) == ("error", "load")
    assert "injected failure" in runs[RAISES].message
    assert runs[RUNS_OUT_OF_MEMORY].outcome == "oom" and "allocate" in runs[RUNS_OUT_OF_MEMORY].message
    assert runs[EXITS].outcome == "crashed" and "without a result" in runs[EXITS].message
    assert runs[KILLED].outcome == "crashed" and "SIGKILL" in runs[KILLED].message
    for key in FAULTS:
        assert runs[key].state == "FAIL" and runs[key].metrics == {}
    assert "time spent:" in stdout and "failed trials" in stdout


def test_a_killed_search_resumes_and_retries_the_interrupted_trial_once(tmp_path, env, killed_search: KilledSearch):
    # The search was killed (SIGKILL) while its fourth trial hung loading (tests/conftest.py: killed_search): its
    # worker and the fork server that forked it died with it.
    assert killed_search.outlived == [], "a worker outlived its search process"
    workdir = killed_search.copy(tmp_path / "killed")
    before = {r.number: r for r in launched(load(workdir)) if r.complete}
    assert len(before) == 2

    completed = subprocess.run([sys.executable, "-m", "autotune", "search", *KILLED_SEARCH, "--trials", "2"],
                               cwd=workdir, env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    interrupted = killed_search.interrupted
    assert f"#{interrupted}" in completed.stdout and "retried once" in completed.stdout
    study = load(workdir)
    after = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert not [t for t in after.values() if t.state.name in ("RUNNING", "WAITING")]
    for number, record in before.items():  # every completed trial is still there, unchanged
        assert after[number].state.name == "COMPLETE" and after[number].user_attrs["metrics"] == record.metrics
    failed = {r.number: r for r in records(study)}[interrupted]
    assert failed.state == "FAIL" and failed.outcome == "crashed" and failed.interrupted
    assert "interrupted" in failed.message and str(killed_search.search_pid) in failed.message
    retries = [t for t in after.values() if t.system_attrs.get("failed_trial") == interrupted]
    assert len(retries) == 1, "the interrupted configuration must be retried exactly once"
    retry = {r.number: r for r in records(study)}[retries[0].number]
    assert retry.config == failed.config and retry.outcome is not None and not retry.interrupted
    assert "retry" in retry.roles


def test_the_budget_is_a_promise(tmp_path, env):
    # The first trial hangs: it is still running at the deadline, so it must be stopped there.
    budget_s = 25
    started = time.monotonic()
    completed = search(
        tmp_path, {**env, "AUTOTUNE_INJECT_FAULTS": json.dumps({"0": {"phase": "measure", "kind": "hang"}})},
        "--budget", f"{budget_s}s",
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert elapsed <= budget_s + max(0.05 * budget_s, 30)
    assert "budget used up" in completed.stdout
    assert "stopped at the deadline" in completed.stdout
    runs = launched(load(tmp_path))
    assert runs[-1].outcome == "budget" and runs[-1].state == "FAIL"
    assert not [r for r in records(load(tmp_path)) if r.state == "RUNNING"]

    # The next run measures that configuration after all: a stopped trial was never measured.
    completed = search(tmp_path, env, "--trials", "2")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    again = [r for r in launched(load(tmp_path))[1:] if r.config == runs[0].config]
    assert len(again) == 1 and again[0].outcome == "ok" and "reference" in again[0].roles


def test_two_searches_on_one_sqlite_study_cooperate(tmp_path, env):
    command = [sys.executable, "-m", "autotune", "search", *SMALL, "--trials", "3", "--study", "shared"]
    first = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: running_trial(tmp_path, "shared"), first, "the first search never started a trial")
    second = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for process in (first, second):
        stdout, stderr = process.communicate(timeout=900)
        assert process.returncode == 0, stdout + stderr
    study = load(tmp_path, "shared")
    runs = launched(study)
    assert len(runs) == 6, [(r.number, r.outcome) for r in records(study)]
    keys = [json.dumps(r.config, sort_keys=True) for r in runs]
    assert len(set(keys)) == len(keys), "a configuration was measured twice"
    assert all(r.outcome is not None for r in runs), "a write was lost"
    assert not [t for t in study.get_trials(deepcopy=False) if t.state.name == "RUNNING"]
    assert len({r.pid for r in runs}) == 6


def test_processes_that_open_a_new_database_at_the_same_moment_all_get_it(tmp_path, env):
    # Each process creates the schema of a database that does not exist yet; all but one find that
    # another got there first, and must go on rather than fail.
    url = f"sqlite:///{tmp_path}/studies/new.db"
    go = tmp_path / "go"
    opener = (  # imports first, says it is ready, then waits for the others: all open at the same moment
        "import sys, time\n"
        "from pathlib import Path\n"
        "from autotune.study import open_storage\n"
        "Path(sys.argv[1]).touch()\n"
        f"while not Path({str(go)!r}).exists(): time.sleep(0.01)\n"
        f"open_storage({url!r})\n"
    )
    ready = [tmp_path / f"ready-{index}" for index in range(6)]
    processes = [
        subprocess.Popen([sys.executable, "-c", opener, str(path)], env=env, stderr=subprocess.PIPE, text=True)
        for path in ready
    ]
    deadline = time.monotonic() + 120
    while not all(path.exists() for path in ready):
        assert time.monotonic() < deadline and all(p.poll() is None for p in processes), "an opener never got ready"
        time.sleep(0.05)
    go.touch()
    errors = [process.communicate(timeout=120)[1] for process in processes]
    assert [process.returncode for process in processes] == [0] * 6, "\n".join(errors)
    assert optuna.get_all_study_names(open_storage(url)) == []
