"""What Optuna's own tools show of a study: objective names, one-line failure reasons, short study
attributes, and trial logs as artifacts. Real SQLite files; the dashboard test resumes a real search killed
mid-trial (one shared with test_faults_e2e.py) while the real optuna-dashboard server reads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
from optuna.artifacts import FileSystemArtifactStore
from optuna.trial import TrialState

from autotune import study as studies
from autotune.errors import UserError
from autotune.process.results import Outcome, TaskResult
from autotune.study import artifacts
from autotune.study.claims import OWNER_ATTR, Claims, this_process
from autotune.study.optuna_internals import study_id
from autotune.study.recovery import recover_interrupted
from tests.conftest import KILLED_SEARCH, KilledSearch
from tests.fakes import BASELINE, new_study, settings


def test_a_new_study_names_its_objectives_with_units_and_keeps_its_attributes_short(tmp_path):
    _, url = new_study(tmp_path / "s.db")
    loaded = optuna.load_study(study_name="fake", storage=url)
    assert loaded.metric_names == [
        "decode throughput [tok/s]",
        "peak memory [GB]",
        "KL divergence vs reference [nats/token]",
    ]
    assert loaded.user_attrs == {
        "model": "org/model",
        "profile": "a10g",
        "workload": "throughput, 8 prompts at a time, 128 tokens in, 64 out",
        "constraints": "none",
    }
    assert studies.stored_settings(loaded).model == "org/model"  # the full settings, from system attributes
    optuna_cli = str(Path(sys.executable).parent / "optuna")
    listed = subprocess.run([optuna_cli, "studies", "--storage", url], capture_output=True, text=True).stdout
    assert "org/model" in listed and max(map(len, listed.splitlines())) < 300


def test_a_study_made_before_gets_its_objective_names_and_short_attributes(tmp_path):
    url = f"sqlite:///{tmp_path}/old.db"
    old = optuna.create_study(study_name="old", storage=url, directions=["maximize", "minimize", "minimize"])
    old.set_user_attr(studies.SETTINGS_ATTR, settings().to_json())  # where autotune kept them before
    old.set_user_attr(studies.RUNS_ATTR, [{"launched": 3}])
    assert studies.stored_settings(old).model == "org/model" and old.metric_names is None
    resumed = studies.load_existing(studies.open_storage(url), "old", seed=0)
    studies.update_settings(resumed, studies.stored_settings(resumed))
    studies.record_search_run(resumed, {"launched": 2})
    again = optuna.load_study(study_name="old", storage=url)
    assert again.metric_names == studies.metric_names()
    assert studies.stored_settings(again).model == "org/model"
    assert studies.search_runs(again) == [{"launched": 3}, {"launched": 2}]
    assert again.user_attrs[studies.SETTINGS_ATTR] == again.user_attrs[studies.RUNS_ATTR] == studies.MOVED_NOTE


def test_a_failed_trial_carries_a_one_line_reason(tmp_path):
    study, _ = new_study(tmp_path / "s.db")
    trial = study.ask()
    message = "CUDA out of memory. Tried to allocate 2.00 GiB\nTraceback (most recent call last): ..."
    studies.record_result(study, trial, TaskResult(Outcome.OOM, message, phase="warmup"), 3.0)
    frozen = study.get_trials(deepcopy=False)[trial.number]
    assert frozen.state == TrialState.FAIL
    assert frozen.user_attrs[studies.FAIL_REASON_ATTR] == "oom: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_an_interrupted_trial_gets_its_reason_and_log_and_its_retry_neither(tmp_path):
    study, url = new_study(tmp_path / "s.db")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    trial = study.ask()
    trial.set_user_attr("config", BASELINE)
    trial.set_user_attr("config_key", "k")
    trial.set_user_attr(OWNER_ATTR, {**this_process(), "pid": dead.pid})
    log_file = tmp_path / "worker.log"
    log_file.write_text("loading the model...\n")
    store = artifacts.open_store(None, url)

    def attach_log(storage: optuna.storages.BaseStorage, trial_id: int, number: int) -> None:
        artifacts.attach_to_trial_id(store, storage, trial_id, log_file)

    storage = studies.open_storage(url)
    study = optuna.load_study(study_name="fake", storage=storage)
    recover_interrupted(study, Claims(storage.engine, study_id(study)), attach_log)
    trials = study.get_trials(deepcopy=False)
    failed = trials[trial.number]
    assert failed.state == TrialState.FAIL
    assert failed.user_attrs[studies.FAIL_REASON_ATTR].startswith(f"interrupted: its process (pid {dead.pid} on ")
    (meta,) = optuna.artifacts.get_all_artifact_meta(failed, storage=storage)
    assert meta.filename == "worker.log" and meta.mimetype == "text/plain"
    with FileSystemArtifactStore(str(tmp_path / "s.artifacts")).open_reader(meta.artifact_id) as reader:
        assert reader.read() == b"loading the model...\n"
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == trial.number]
    assert retry.state == TrialState.WAITING and studies.FAIL_REASON_ATTR not in retry.user_attrs
    assert optuna.artifacts.get_all_artifact_meta(retry, storage=storage) == []  # its own log comes when it runs


@pytest.mark.parametrize(
    ("location", "message"),
    [("s3://", "name a bucket only"), ("gs://bucket/sub", "name a bucket only"), ("FILE", "is a file, not a folder")],
)
def test_a_bad_artifact_location_is_bad_input(tmp_path, location, message):
    if location == "FILE":
        location = str(tmp_path / "f")
        Path(location).write_text("")
    with pytest.raises(UserError, match=message):
        artifacts.open_store(location, "sqlite:///x.db")


def test_artifacts_go_beside_the_sqlite_file_and_a_server_database_needs_a_location():
    assert artifacts.default_location("sqlite:///studies/demo-cpu.db") == "studies/demo-cpu.artifacts"
    assert artifacts.default_location("postgresql://tuner@db/studies") is None


# ----------------------------------------------------------------------------- optuna-dashboard, for real


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_dashboard(workdir: Path) -> tuple[subprocess.Popen, str, dict]:
    """optuna-dashboard on the study of `workdir`, once it answers: the process, its address, its study list.
    On a port free a moment before, which another process may take meanwhile: then on another one."""
    for _ in range(3):
        port = _free_port()
        dashboard = subprocess.Popen(
            [str(Path(sys.executable).parent / "optuna-dashboard"), "sqlite:///studies/demo-cpu.db",
             "--artifact-dir", "studies/demo-cpu.artifacts", "--port", str(port), "--quiet"],
            cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while dashboard.poll() is None:
            try:
                return dashboard, base, json.loads(_get(f"{base}/api/studies"))
            except OSError:
                assert time.monotonic() < deadline, "the dashboard never answered"
                time.sleep(0.5)
    raise AssertionError("the dashboard ended before it answered, on three ports")


def _get(url: str) -> bytes:
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1, whatever HTTP_PROXY says
    with direct.open(url, timeout=30) as answer:
        return answer.read()


@pytest.mark.slow
def test_optuna_dashboard_reads_while_a_search_writes_and_shows_objective_names_and_failures_with_logs(
    tmp_path, cache_dir, killed_search: KilledSearch
):
    """On a copy of a search killed (SIGKILL) while its fourth trial hung loading, its third having failed with an
    injected error (tests/conftest.py: killed_search)."""
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache_dir)}
    workdir = killed_search.copy(tmp_path / "killed")
    interrupted = killed_search.interrupted
    dashboard, base, listed = _start_dashboard(workdir)
    try:
        (study_id,) = [s["study_id"] for s in listed["study_summaries"] if s["study_name"] == "demo-cpu"]
        # The search resumes, and writes its trial, while the dashboard reads the same file again and again.
        command = [sys.executable, "-m", "autotune", "search", *KILLED_SEARCH, "--trials", "1"]
        resuming = subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)  # fmt: skip
        reads = 0
        while resuming.poll() is None:
            json.loads(_get(f"{base}/api/studies/{study_id}"))
            reads += 1
            with contextlib.suppress(subprocess.TimeoutExpired):
                resuming.wait(timeout=0.2)
        stdout, stderr = resuming.communicate()
        assert resuming.returncode == 0 and reads > 0, stdout + stderr
        assert "is locked" not in stdout + stderr  # a reader that reads in short statements never held it up
        assert "trial logs and the report are stored as Optuna artifacts in studies/demo-cpu.artifacts" in stdout

        detail = json.loads(_get(f"{base}/api/studies/{study_id}"))
        assert detail["objective_names"] == studies.metric_names()
        assert detail["artifacts"] and detail["artifacts"][0]["filename"].endswith(".html")  # the report
        trials = {trial["number"]: trial for trial in detail["trials"]}

        def reason_and_log(number: int) -> tuple[str, bytes]:
            trial = trials[number]
            assert trial["state"] == "Fail"
            reason = {a["key"]: a["value"] for a in trial["user_attrs"]}[studies.FAIL_REASON_ATTR]
            (log_meta,) = [a for a in trial["artifacts"] if a["filename"] == "worker.log"]
            log = _get(f"{base}/artifacts/{study_id}/{trial['trial_id']}/{log_meta['artifact_id']}")
            return reason, log

        (raised,) = [t["number"] for t in trials.values() if "injected failure" in str(t["user_attrs"])]
        reason, log = reason_and_log(raised)
        assert reason.startswith("error: ") and "injected failure" in reason
        assert b"injected failure" in log
        reason, log = reason_and_log(interrupted)
        assert reason.startswith("interrupted: its process (pid ")
        assert b"autotune phase: load at " in log  # how far it got: it hung while loading
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=10)
