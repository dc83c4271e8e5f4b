"""Many workers on one study: PostgreSQL shared by `autotune worker` processes (one killed, the connections of the
others cut by the server), one worker per device (with --eval: the front's finalists evaluated by the workers, one
killed mid-evaluation), and a nightly warm start. Real processes, a real PostgreSQL server, the demo model.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import psutil
import pytest
import sqlalchemy

from autotune.errors import UserError
from autotune.for_tests import FINALISTS
from autotune.study import open_storage, records
from autotune.study.claims import DONE, RUNNING, Claims, EvaluationClaim, Evaluations
from autotune.study.evaluations import evaluated_numbers
from autotune.study.opened import OpenedStudy
from autotune.worker.demo_model import ensure_demo_model
from tests.conftest import BRIEF, cheap_space
from tests.postgres import postgres_url  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow

SMALL = ["--batch-size", "4", "--input-len", "64", "--output-len", "32", *BRIEF]
# The searches take cheap_space: what these tests check is the sharing of a study, not the space (the default one sent
# their workers into compiled and tensor-parallel trials, a minute each).


@pytest.fixture
def env(cache_dir: Path) -> dict[str, str]:
    ensure_demo_model(cache_dir)
    return {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache_dir)}


@pytest.fixture
def release(tmp_path: Path) -> Path:
    """The file whose creation ends the stalls below: the test creates it once its kill has landed."""
    return tmp_path / "release-the-stalls"


@pytest.fixture
def stalling_env(env: dict[str, str], release: Path) -> dict[str, str]:
    """Each process's first trial stalls while loading, until `release` exists: a test's kill surely lands while a
    trial runs, and the others go on as soon as it has."""
    stall = {"phase": "load", "kind": "stall", "until": str(release)}
    return {**env, "AUTOTUNE_INJECT_FAULTS": json.dumps({"0": stall})}


def cli(args: list[str], workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=1200)  # fmt: skip


def measured_keys(study: optuna.Study) -> list[str]:
    """Configurations of trials that ran to an outcome of their own (not interrupted, not stopped)."""
    return [
        json.dumps(r.config, sort_keys=True)
        for r in records(study)
        if r.launched and r.outcome and not r.interrupted and r.outcome != "budget"
    ]


def test_three_workers_share_a_postgresql_study_and_survive_one_killed_and_their_connections_cut(
    tmp_path,
    env,
    stalling_env,
    release,
    postgres_url,  # noqa: F811
):
    created = cli(["search", "--model", "demo", "--gpu", "cpu", "--study", "shared", "--storage", postgres_url,
                   *cheap_space(tmp_path), "--trials", "1", *SMALL], tmp_path, env)  # fmt: skip
    assert created.returncode == 0, created.stdout + created.stderr
    command = [sys.executable, "-m", "autotune", "worker", "--study", "shared", "--storage", postgres_url,
               "--trials", "3", "--device", "cpu"]  # fmt: skip
    workers = [subprocess.Popen(command, cwd=tmp_path, env=stalling_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for _ in range(3)]  # fmt: skip
    victim = workers[0]
    study = optuna.load_study(study_name="shared", storage=postgres_url)
    deadline = time.monotonic() + 600
    doomed = None
    while doomed is None and time.monotonic() < deadline:
        for trial in study.get_trials(deepcopy=False):
            owner = trial.user_attrs.get("owner", {})
            if trial.state.name == "RUNNING" and owner.get("pid") == victim.pid and "worker_pid" in trial.user_attrs:
                doomed = trial
        time.sleep(0.5)
    assert doomed is not None, "the first worker never started a trial"
    victim.send_signal(signal.SIGKILL)  # mid-trial
    victim.wait()
    cut = _terminate_backends(postgres_url, [worker.pid for worker in workers[1:]])  # their connections, mid-trial
    assert cut, "the other workers held no connection to cut"
    release.touch()
    for worker in workers[1:]:
        output, _ = worker.communicate(timeout=1200)
        assert worker.returncode == 0, output  # the others went on, on new connections

    study = optuna.load_study(study_name="shared", storage=postgres_url)
    states = [t.state.name for t in study.get_trials(deepcopy=False)]
    assert "RUNNING" not in states and "WAITING" not in states, "a trial was left unaccounted for"
    by_number = {r.number: r for r in records(study)}
    assert by_number[doomed.number].interrupted and by_number[doomed.number].state == "FAIL"
    retries = [t for t in study.get_trials(deepcopy=False) if t.system_attrs.get("failed_trial") == doomed.number]
    assert len(retries) == 1
    retry = by_number[retries[0].number]
    assert retry.config == by_number[doomed.number].config and not retry.interrupted
    # Measured, or skipped with its reason when one of its values was excluded meanwhile (another worker's trial met a
    # typed refusal of it): decided either way, never lost.
    assert retry.outcome or retry.skipped, f"the retry #{retry.number} was neither measured nor skipped"
    assert retry.pid is not None or retry.skipped  # a measured retry ran in a trial process
    assert retries[0].user_attrs["owner"]["pid"] != victim.pid  # another worker took it
    keys = measured_keys(study)
    assert len(keys) == len(set(keys)), "a configuration was measured twice"
    assert len(keys) == 1 + 3 + 3  # the search's trial, then three by each surviving worker


def _terminate_backends(url: str, pids: list[int]) -> list[int]:
    """pg_terminate_backend on every server process serving a connection of these processes; their ids."""
    ports = [
        connection.laddr.port
        for pid in pids
        for connection in psutil.Process(pid).net_connections(kind="tcp")
        if connection.raddr and connection.raddr.port == sqlalchemy.engine.make_url(url).port
    ]
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.begin() as connection:
            backends = connection.execute(
                sqlalchemy.text("SELECT pid FROM pg_stat_activity WHERE client_port = ANY(:ports)"), {"ports": ports}
            ).scalars()
            return [pid for pid in list(backends) if connection.execute(
                sqlalchemy.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()]  # fmt: skip
    finally:
        engine.dispose()


def test_one_worker_per_device_shares_the_study_and_its_finalists_a_killed_workers_taken_by_the_other(
    tmp_path,
    env,
    release,
    postgres_url,  # noqa: F811
):
    """`search --devices cpu,cpu --eval demo` on PostgreSQL: the reference evaluated once, the trials shared by the two
    workers, then the front's finalists, each claimed by one worker. Every finalist's evaluation stalls (planted) until
    the worker seen evaluating first is killed: its finalist is evaluated by the other worker."""
    name = f"devices-{uuid.uuid4().hex[:8]}"  # a PostgreSQL study's files go to the shared cache: a folder of its own
    stall = {FINALISTS: {"phase": "evaluate", "kind": "stall", "until": str(release)}}
    search = subprocess.Popen([sys.executable, "-m", "autotune", "search", "--model", "demo", "--gpu", "cpu", "--study",
                               name, "--storage", postgres_url, "--devices", "cpu,cpu", "--trials", "4", "--eval",
                               "demo", "--eval-limit", "40", *cheap_space(tmp_path), *SMALL], cwd=tmp_path,
                              env={**env, "AUTOTUNE_INJECT_FAULTS": json.dumps(stall)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    victim, taken = _first_evaluating(postgres_url, name, deadline_s=600)
    os.kill(victim, signal.SIGKILL)  # mid-evaluation
    release.touch()
    output, errors = search.communicate(timeout=1200)
    assert search.returncode == 1, output + errors
    assert "cpu was killed by SIGKILL (its lines above say why)" in errors
    assert "[worker 0, cpu]" in output and "[worker 1, cpu]" in output
    study = optuna.load_study(study_name=name, storage=postgres_url)
    run = [r for r in records(study) if r.launched and r.run_id]
    assert len(run) == 4 and len({r.run_id for r in run}) == 1, output
    assert len({r.config_key for r in run}) == 4
    workers = {t.user_attrs["owner"]["pid"] for t in study.get_trials(deepcopy=False) if t.number in
               {r.number for r in run}}  # fmt: skip
    assert len(workers) == 2 and victim in workers
    assert "RUNNING" not in {t.state.name for t in study.get_trials(deepcopy=False)}
    # Every finalist evaluated once: the victim's by the other worker, on its second attempt; none left running.
    claims = _evaluations(postgres_url, name)
    front = OpenedStudy.of(study, postgres_url).front_numbers
    assert front and front <= evaluated_numbers(study.user_attrs) and front <= set(claims)
    assert {claim.state for claim in claims.values()} == {DONE}
    assert claims[taken].attempts == 2 and claims[taken].owner["pid"] in workers - {victim}
    assert all(claim.attempts == 1 for number, claim in claims.items() if number != taken)
    assert f"the front's {len(front)} finalists: {len(front)} evaluated on the task" in output
    assert "report: reports/" in output  # what the workers measured and evaluated is reported
    # The search (which created the study) and each worker prepared in a folder of their own: in one, the second
    # worker to start deleted the first one's result before the first read it ("exited with status 0 without a result").
    prepared = list((Path(env["AUTOTUNE_CACHE_DIR"]) / "studies" / name).glob("prepare-*"))
    assert len(prepared) == 3 and all((folder / "result.json").is_file() for folder in prepared), prepared


def _evaluations(url: str, name: str) -> dict[int, EvaluationClaim]:
    storage = open_storage(url)
    return Evaluations(Claims(storage.engine, storage.get_study_id_from_name(name))).claims()


def _first_evaluating(url: str, name: str, deadline_s: float) -> tuple[int, int]:
    """The pid of the first worker seen evaluating a finalist, and that finalist's trial number."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        with contextlib.suppress(KeyError, sqlalchemy.exc.DBAPIError, UserError):  # the study is not created yet
            for number, claim in _evaluations(url, name).items():
                if claim.state == RUNNING:
                    return claim.owner["pid"], number
    raise AssertionError("no worker started evaluating a finalist")


def test_devices_must_exist(tmp_path, env):
    completed = cli(["search", "--model", "demo", "--gpu", "cpu", "--devices", "0,1", "--trials", "2"], tmp_path, env)
    assert completed.returncode == 2 and "--devices 0" in completed.stderr


def test_warm_start_measures_the_previous_front_first(tmp_path, env):
    first = cli(["search", "--model", "demo", "--gpu", "cpu", "--study", "night-1", "--trials", "4", "--seed", "1",
                 *cheap_space(tmp_path), *SMALL], tmp_path, env)  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    previous = optuna.load_study(study_name="night-1", storage=f"sqlite:///{tmp_path}/studies/night-1.db")
    front = {json.dumps(r.config, sort_keys=True) for r in records(previous) if r.number in
             {t.number for t in previous.best_trials}}  # fmt: skip
    second = cli(["search", "--model", "demo", "--gpu", "cpu", "--study", "night-2", "--warm-start", "night-1",
                  "--trials", str(len(front) + 2), "--seed", "2", *cheap_space(tmp_path), *SMALL],
                 tmp_path, env)  # fmt: skip
    assert second.returncode == 0, second.stdout + second.stderr
    assert "warm start:" in second.stdout
    tonight = optuna.load_study(study_name="night-2", storage=f"sqlite:///{tmp_path}/studies/night-2.db")
    first_ones = [json.dumps(r.config, sort_keys=True) for r in records(tonight) if r.launched][: len(front) + 2]
    assert front <= set(first_ones), "a configuration of last night's front was not measured first"


def test_a_worker_killed_mid_trial_fails_the_search_and_leaves_no_trial_running(tmp_path, stalling_env, release):
    search = subprocess.Popen([sys.executable, "-m", "autotune", "search", "--model", "demo", "--gpu", "cpu",
                               "--study", "dies", "--devices", "cpu,cpu", "--trials", "4", *cheap_space(tmp_path),
                               *SMALL], cwd=tmp_path, env=stalling_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
    victim = _owner_of_a_measured_trial(tmp_path / "studies" / "dies.db", "dies", deadline_s=600)
    os.kill(victim, signal.SIGKILL)
    release.touch()
    output, errors = search.communicate(timeout=1200)
    assert search.returncode == 1, output + errors
    assert "cpu was killed by SIGKILL (its lines above say why)" in errors
    assert "report: reports/dies.html" in output  # what the other worker measured is reported
    study = optuna.load_study(study_name="dies", storage=f"sqlite:///{tmp_path}/studies/dies.db")
    states = [t.state.name for t in study.get_trials(deepcopy=False)]
    assert "RUNNING" not in states, "the killed worker's trial was left running"
    killed = [r for r in records(study) if r.interrupted]
    assert len(killed) == 1 and killed[0].outcome == "crashed" and "died" in killed[0].message
    assert any(t.system_attrs.get("failed_trial") == killed[0].number for t in study.get_trials(deepcopy=False))


def _owner_of_a_measured_trial(path: Path, name: str, deadline_s: float) -> int:
    """The pid of the first worker seen measuring a trial (its trial worker already started)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if not path.exists():  # opening a missing SQLite file would create it
            continue
        # The study is not created yet, or the file is busy with the search's own writes.
        with contextlib.suppress(KeyError, sqlalchemy.exc.DBAPIError, optuna.exceptions.StorageInternalError):
            for trial in optuna.load_study(study_name=name, storage=f"sqlite:///{path}").get_trials(deepcopy=False):
                if trial.state.name == "RUNNING" and "worker_pid" in trial.user_attrs:
                    return trial.user_attrs["owner"]["pid"]
    raise AssertionError("no worker started a trial")
