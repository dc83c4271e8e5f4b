"""Ctrl-C / SIGINT / SIGTERM to a real `autotune search` and `autotune worker` on the demo model.

The running trial is recorded at once as failed with the reason `interrupted`, the worker and the
fork server end, one line says what was kept and how to resume, and the exit status is 128 + signal.
The interrupted configuration is retried once; interrupted again, it never comes back.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest

from autotune.study import open_storage, records
from autotune.worker.demo_model import ensure_demo_model
from tests.conftest import BRIEF, announced, processes_of

pytestmark = pytest.mark.slow

SMALL = ["--model", "demo", "--gpu", "cpu", "--batch-size", "2", "--input-len", "32", "--output-len", "16", *BRIEF]
# Hangs while loading, which every launched trial reaches (a configuration may fail before it measures).
HANG_THIRD = json.dumps({"2": {"phase": "load", "kind": "hang"}})
HANG_FIRST = json.dumps({"0": {"phase": "load", "kind": "hang"}})


@pytest.fixture
def env(cache_dir: Path) -> dict[str, str]:
    ensure_demo_model(cache_dir)
    return {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache_dir)}


def _study(url: str) -> optuna.Study:
    return optuna.load_study(study_name="demo-cpu", storage=open_storage(url))


def _hanging_trial(url: str, database: Path, process: subprocess.Popen, after: int) -> optuna.trial.FrozenTrial:
    """Wait until the process measures the trial whose worker hangs (the injected fault, after `after`
    complete trials); return it."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        if database.exists():
            try:
                trials = _study(url).get_trials(deepcopy=False)
            except KeyError:  # the file exists a moment before the study in it
                trials = []
            running = [t for t in trials if t.state.name == "RUNNING" and "worker_pid" in t.user_attrs]
            complete = [t for t in trials if t.state.name == "COMPLETE"]
            hanging = running and announced(database.parent / "demo-cpu", running[0].number, "load")
            if hanging and len(complete) == after:
                return running[0]
        time.sleep(0.5)
    raise AssertionError(f"no hanging trial: {process.communicate()}")


def _interrupt(process: subprocess.Popen, signum: int, url: str, database: Path, after: int):
    """Signal the process mid-trial; return the trial and the process's output once it and its workers ended."""
    trial = _hanging_trial(url, database, process, after)
    pids = processes_of(process.pid, trial.user_attrs["worker_pid"])
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    gone_by = time.monotonic() + 15
    while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids):
        assert time.monotonic() < gone_by, "a worker or the fork server outlived the interrupted process"
        time.sleep(0.2)
    return trial, stdout, stderr


def _start(args: list[str], cwd: Path, env: dict[str, str], faults: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", *args], cwd=cwd, env={**env, "AUTOTUNE_INJECT_FAULTS": faults},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_interrupts_record_the_trial_and_an_interrupted_configuration_is_retried_once(tmp_path: Path, env):
    cwd, elsewhere = tmp_path / "cwd", tmp_path / "elsewhere"
    cwd.mkdir()
    database = elsewhere / "studies.db"
    url = f"sqlite:///{database}"

    # 1. Ctrl-C (SIGINT) to `autotune search` while its third trial runs.
    search = _start(["search", *SMALL, "--trials", "6", "--storage", url], cwd, env, HANG_THIRD)
    first, stdout, stderr = _interrupt(search, signal.SIGINT, url, database, after=2)
    assert search.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        f"autotune: interrupted by SIGINT; trial #{first.number} was recorded as failed (interrupted) and is retried "
        f"once on resume; study demo-cpu keeps its 3 recorded trials (2 complete) in {url}; "
        "run the same command again to resume"
    )
    study = _study(url)
    interrupted = {r.number: r for r in records(study)}[first.number]
    assert interrupted.state == "FAIL" and interrupted.outcome == "interrupted" and interrupted.interrupted
    assert not [t for t in study.get_trials(deepcopy=False) if t.state.name == "RUNNING"]
    waiting = [t for t in study.get_trials(deepcopy=False) if t.state.name == "WAITING"]
    assert [t.system_attrs.get("failed_trial") for t in waiting] == [first.number]
    # The trial files live beside the study's storage, never under the working folder's studies/.
    assert not (cwd / "studies").exists()
    prepared = [folder.name for folder in (elsewhere / "demo-cpu").glob("prepare-*")]
    assert prepared == [f"prepare-{socket.gethostname()}-{search.pid}"]
    # Its log is stored with it, as for a trial recovered after a SIGKILL.
    frozen = study.get_trials(deepcopy=False)[first.number]
    (log,) = optuna.artifacts.get_all_artifact_meta(frozen, storage=open_storage(url))
    assert log.mimetype == "text/plain"

    # 2. SIGTERM to `autotune worker` while it runs the retry: the configuration is interrupted twice.
    worker = _start(["worker", "--study", "demo-cpu", "--storage", url, "--trials", "3"], cwd, env, HANG_FIRST)
    retry, stdout, stderr = _interrupt(worker, signal.SIGTERM, url, database, after=2)
    assert worker.returncode == 143, stdout + stderr
    assert "Traceback" not in stderr
    assert f"interrupted by SIGTERM; trial #{retry.number} was recorded as failed (interrupted)" in stderr
    assert stdout.count("were interrupted") == 1, stdout  # the resume note, once per run
    assert retry.system_attrs.get("failed_trial") == first.number
    study = _study(url)
    assert not [t for t in study.get_trials(deepcopy=False) if t.state.name in ("RUNNING", "WAITING")]

    # 3. A resumed search never brings that configuration back, from the planner or the sampler.
    completed = subprocess.run(
        [sys.executable, "-m", "autotune", "search", *SMALL, "--trials", "3", "--storage", url],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    same = [r for r in records(_study(url)) if r.config_key == interrupted.config_key and r.launched]
    assert [r.number for r in same] == [first.number, retry.number]
    assert len([r for r in records(_study(url)) if r.launched and r.number > retry.number]) == 3
