"""deploy/slurm/autotune-workers.sbatch on a real one-node Slurm cluster: two CPU workers, one job step each,
on a PostgreSQL the job starts itself; one worker's step is cancelled mid-trial, and no trial is lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import sqlalchemy

from autotune.study import records
from autotune.worker.demo_model import ensure_demo_model
from tests.conftest import BRIEF, REPO, cheap_space
from tests.postgres import _as_server_user, _binary, _free_port
from tests.slurm import SlurmCluster, job_ended, slurm_cluster, step_of  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow

SCRIPT = REPO / "deploy" / "slurm" / "autotune-workers.sbatch"
# The workload shape of the other end-to-end searches (tests/e2e).
SMALL = f"--batch-size 2 --input-len 32 --output-len 16 {' '.join(BRIEF)}"
# Each worker's second trial stalls while loading, so the cancel surely lands while a trial runs; the study's first
# trial (the creating search's only one) does not. The stalls end once the cancelled worker has left its step (the
# test then writes RELEASE) instead of lasting their 30 s, which the other worker used to wait out.
RELEASE = "release-the-stalls"
WAIT_S = 900


@pytest.fixture
def job_folder() -> Iterator[Path]:
    """The job's working folder, outside pytest's root-only folder: the job's PostgreSQL runs as postgres."""
    folder = Path(tempfile.mkdtemp(prefix="autotune-slurm-job-"))
    folder.chmod(0o755)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=False)


def submit(cluster: SlurmCluster, folder: Path, cache_dir: Path) -> str:
    # cheap_space: the default space's compiled trials compiled anew in a one-CPU step when no test had compiled them
    env = {
        **cluster.env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "AUTOTUNE_CACHE_DIR": str(cache_dir),
        "AUTOTUNE_STUDY": "slurm",
        "AUTOTUNE_SEARCH": f"--model demo --gpu cpu {' '.join(cheap_space(folder))} {SMALL}",
        "AUTOTUNE_DEVICE": "cpu",
        "AUTOTUNE_TRIALS": "3",
        "AUTOTUNE_INJECT_FAULTS": json.dumps({"1": {"phase": "load", "kind": "stall", "until": str(folder / RELEASE)}}),
    }
    command = ["sbatch", "--parsable", "--ntasks=2", "--cpus-per-task=1", "--time=30", f"--chdir={folder}",
               f"--output={folder}/job.out", str(SCRIPT)]  # fmt: skip
    submitted = subprocess.run(command, cwd=folder, env=env, check=True, capture_output=True, text=True)
    print(f"$ {' '.join(command[:-1])} deploy/slurm/autotune-workers.sbatch\n{submitted.stdout.strip()}")
    return submitted.stdout.strip().split(";")[0]


def open_study(url_file: Path) -> optuna.Study | None:
    """The job's study once its database is up and the study created; None before (a read that met the job creating
    Optuna's tables included: seen in a random-order run, `duplicate key ... studydirection`)."""
    if not url_file.exists():
        return None
    try:
        return optuna.load_study(study_name="slurm", storage=url_file.read_text().strip())
    except KeyError:
        return None
    except sqlalchemy.exc.DBAPIError:  # the job creates Optuna's tables while this reads: both ran CREATE TYPE
        return None


def stalled_trial(cluster: SlurmCluster, job: str, study: optuna.Study) -> tuple[optuna.trial.FrozenTrial, str] | None:
    """A trial that runs now, in a worker's step, as that worker's second launched trial (which stalls); and
    that step. Trials skipped before launch (PRUNED: another worker had claimed the configuration) do not count."""
    trials = study.get_trials(deepcopy=False)
    for trial in trials:
        owner = trial.user_attrs.get("owner", {}).get("pid")
        if trial.state.name != "RUNNING" or "worker_pid" not in trial.user_attrs:
            continue
        measured = [t for t in trials if _owner(t) == owner and t.state.name in ("COMPLETE", "FAIL")]
        step = step_of(cluster, job, owner)
        if measured and step is not None and not step.endswith(".0"):  # step 0 created the study
            return trial, step
    return None


def _owner(trial: optuna.trial.FrozenTrial) -> int | None:
    return trial.user_attrs.get("owner", {}).get("pid")


def wait_for(found, what: str, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while not (result := found()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return result


def test_two_workers_one_cancelled_mid_trial_lose_no_trial(slurm_cluster, job_folder, cache_dir):  # noqa: F811
    assert slurm_cluster.cpus >= 2, "two workers need two CPUs"
    ensure_demo_model(cache_dir)
    job = submit(slurm_cluster, job_folder, cache_dir)
    url_file = job_folder / "autotune-postgres" / "autotune-url"

    study = wait_for(lambda: open_study(url_file), "the job's database and study")
    doomed, step = wait_for(lambda: stalled_trial(slurm_cluster, job, study), "a worker's second trial")
    victim = doomed.user_attrs["owner"]["pid"]
    subprocess.run(["scancel", step], env=slurm_cluster.env, check=True)
    print(f"$ scancel {step}   # the worker (pid {victim}) running trial #{doomed.number}, mid-trial")
    wait_for(lambda: step_of(slurm_cluster, job, victim) is None, f"the worker of step {step} to end")
    (job_folder / RELEASE).touch()
    wait_for(lambda: job_ended(slurm_cluster, job), f"job {job} to end")

    output = (job_folder / "job.out").read_text()
    print("job output (autotune-workers lines):")
    print("\n".join(line for line in output.splitlines() if line.startswith(("autotune-workers", "slurmstepd"))))
    assert "autotune-workers: 1 of 2 workers finished; report: reports/slurm.html" in output, output
    assert (job_folder / "reports" / "slurm.html").is_file()

    with restarted(job_folder / "autotune-postgres") as url:
        study = optuna.load_study(study_name="slurm", storage=url)
        check_nothing_lost(study, doomed.number, victim)


def check_nothing_lost(study: optuna.Study, doomed: int, victim: int) -> None:
    trials = study.get_trials(deepcopy=False)
    by_number = {r.number: r for r in records(study)}
    print("the study afterwards:")
    for trial in trials:
        record = by_number[trial.number]
        retry = trial.system_attrs.get("failed_trial")
        print(f"  #{trial.number} {trial.state.name:8} {record.outcome or '-':12} owner pid {_owner(trial)}"
              + (f", retry of #{retry}" if retry is not None else "")
              + (f", {record.message[:80]}" if record.interrupted else ""))  # fmt: skip
    states = {trial.state.name for trial in trials}
    assert not states & {"RUNNING", "WAITING"}, "a trial was left unaccounted for"
    assert by_number[doomed].interrupted and by_number[doomed].state == "FAIL"
    retries = [trial for trial in trials if trial.system_attrs.get("failed_trial") == doomed]
    assert len(retries) == 1, "the cancelled trial was not retried exactly once"
    retry = by_number[retries[0].number]
    assert retry.config == by_number[doomed].config and not retry.interrupted
    # Measured, or skipped with its reason when one of its values was excluded meanwhile (another worker's trial met a
    # typed refusal of it): decided either way, never lost.
    assert retry.outcome or retry.skipped, f"the retry #{retry.number} was neither measured nor skipped"
    assert retries[0].user_attrs["owner"]["pid"] != victim  # the other worker took it
    # Both workers ran trials to their end (the victim's may all be pruned or refused: which, the sampler decides).
    ended_by = {_owner(trial) for trial in trials if trial.number != doomed}
    assert victim in ended_by and len(ended_by) == 3, "trials from the creating search and from both workers"
    measured = [json.dumps(r.config, sort_keys=True) for r in by_number.values()
                if r.launched and r.outcome and not r.interrupted]  # fmt: skip
    assert len(measured) == len(set(measured)), "a configuration was measured twice"


class restarted:  # noqa: N801 - used as a context manager, like contextlib's
    """The job's PostgreSQL started again on its kept data folder (the job stopped it): its URL."""

    def __init__(self, data: Path) -> None:
        self.data, self.pg_ctl = data, _binary("pg_ctl")

    def __enter__(self) -> str:
        port = _free_port()
        options = f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories=''"
        subprocess.run(_as_server_user([self.pg_ctl, "-D", str(self.data), "-o", options, "-l",
                                        str(self.data / "server.log"), "-w", "start"]), check=True)  # fmt: skip
        password = (self.data / "autotune-password").read_text().strip()
        return f"postgresql+psycopg://autotune:{password}@127.0.0.1:{port}/studies"

    def __exit__(self, *exception: object) -> None:
        subprocess.run(_as_server_user([self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop"]), check=False)
