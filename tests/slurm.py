"""A real one-node Slurm cluster for the tests: munged, slurmctld and slurmd started in a temporary folder.

Debian's `slurm-wlm` and `munge` packages provide the daemons (.ci/run installs them). The node runs jobs
as the user who submits them, so slurmd must run as root; the cluster uses no cgroups (proctrack/linuxproc,
task/none) and schedules CPUs (select/cons_tres, CR_CPU). Every path and port is the test's own: the
machine's Slurm configuration, if any, is not touched.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scancel", "squeue", "scontrol")
START_TIMEOUT_S = 60


@dataclass(frozen=True)
class SlurmCluster:
    root: Path  # its configuration, state and logs; readable by every user (the job's PostgreSQL runs as postgres)
    env: dict[str, str]  # SLURM_CONF for the clients
    cpus: int

    def run(self, *command: str) -> str:
        return subprocess.run(command, env=self.env, check=True, capture_output=True, text=True).stdout

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted(self.root.glob("*.log")))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _configuration(root: Path, host: str, cpus: int) -> str:
    return f"""ClusterName=autotune-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def _start_munge(root: Path) -> None:
    folder = root / "munge"
    folder.mkdir(mode=0o755)
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    subprocess.run(["munged", "--force", f"--socket={folder}/munge.socket", f"--key-file={key}",
                    f"--log-file={root}/munged.log", f"--pid-file={folder}/munged.pid",
                    f"--seed-file={folder}/munged.seed"], check=True, capture_output=True)  # fmt: skip


def _wait_until_idle(cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    state = ""
    while time.monotonic() < deadline:
        state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=cluster.env, capture_output=True, text=True).stdout
        if state.strip() == "idle":
            return
        time.sleep(0.5)
    raise AssertionError(f"the Slurm node never became idle (sinfo: {state.strip()!r}):\n{cluster.logs()}")


def _stop(pid_file: Path) -> None:
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)


def _cancel_every_job(cluster: SlurmCluster) -> None:
    """Cancel what is left, and give the jobs time to clean up (their own databases, ...)."""
    subprocess.run(["scancel", "--user", "root"], env=cluster.env, capture_output=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        jobs = subprocess.run(["squeue", "-h"], env=cluster.env, capture_output=True, text=True)
        if jobs.returncode != 0 or not jobs.stdout.strip():
            return
        time.sleep(0.5)


def job_ended(cluster: SlurmCluster, job: str) -> bool:
    """Neither pending nor running (squeue forgets a job some minutes after it ends: that is ended too)."""
    listed = subprocess.run(["squeue", "-h", "-j", job], env=cluster.env, capture_output=True, text=True)
    return listed.returncode != 0 or not listed.stdout.strip()


LISTPIDS_TRIES = 20  # half a second apart: a step being torn down leaves `scontrol listpids` failing a moment


def step_of(cluster: SlurmCluster, job: str, pid: int) -> str | None:
    """The step (JOB.STEP) a process belongs to, from `scontrol listpids`; None if in none of the job's. While a step
    is torn down (a worker cancelled) its slurmstepd may not answer, and the listing fails: asked again."""
    for _ in range(LISTPIDS_TRIES):
        listed = subprocess.run(["scontrol", "listpids", job], env=cluster.env, capture_output=True, text=True)
        if listed.returncode == 0:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"scontrol listpids {job} failed {LISTPIDS_TRIES} times: {listed.stderr.strip()}")
    for line in listed.stdout.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == str(pid):
            return f"{fields[1]}.{fields[2]}"
    return None


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[SlurmCluster]:
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        pytest.skip(f"Slurm is not installed (no {', '.join(missing)}; Debian packages slurm-wlm and munge)")
    if os.geteuid() != 0:
        pytest.skip("slurmd runs jobs as their users, so it must run as root")
    root = Path(tempfile.mkdtemp(prefix="autotune-slurm-"))  # not under pytest's root-only folder
    root.chmod(0o755)
    for folder in ("state", "spool"):
        (root / folder).mkdir()
    host = socket.gethostname()
    cpus = len(os.sched_getaffinity(0))  # the CPUs this process may run on: a container's, not its host's
    (root / "slurm.conf").write_text(_configuration(root, host, cpus))
    cluster = SlurmCluster(root, {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}, cpus)
    try:
        _start_munge(root)
        subprocess.run(["slurmctld", "-i"], env=cluster.env, check=True, capture_output=True)
        subprocess.run(["slurmd", "-N", host], env=cluster.env, check=True, capture_output=True)
        _wait_until_idle(cluster)
        yield cluster
    finally:
        _cancel_every_job(cluster)
        _stop(root / "slurmd.pid")
        _stop(root / "slurmctld.pid")
        subprocess.run(["munged", "--stop", f"--socket={root}/munge/munge.socket"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
