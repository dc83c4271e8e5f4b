"""The fork server (autotune.worker.forkserver) seen through the runner: a real server forking real workers.

What a worker's failure becomes is in test_runner.py; here, what happens to the server and the processes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from autotune.process import fork_client
from autotune.process.fork_client import ForkServer, TemplateServer
from autotune.process.life import TEMPLATE_VARIABLE
from autotune.process.results import Outcome
from autotune.process.runner import Limits, run_in_worker
from autotune.worker.forkserver import import_time_difference
from tests.conftest import REPO
from tests.process.test_runner import faulty_spec

pytestmark = pytest.mark.slow  # the server imports torch and transformers once: tens of seconds here


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    """A fork server of these tests' own, used by run_in_worker, started before any task is timed."""
    own = ForkServer()
    own.disabled = False  # whatever AUTOTUNE_FORK_SERVER says: this is what is under test
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(TEMPLATE_VARIABLE, raising=False)  # a server of its own, the command's child (the template: below)
        patch.setattr(fork_client, "FORK_SERVER", own)
        assert own._running(), "the fork server did not start"
        yield own
    own._stop()


def parents_of_workers(parents: list[int]):
    """An on_start that records the parent of each worker the runner starts."""
    return lambda pid: parents.append(psutil.Process(pid).ppid())


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def group_members(pgid: int) -> list[int]:
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def test_each_task_runs_in_a_fresh_process_forked_by_the_one_server(tmp_path, server):
    parents: list[int] = []
    spec = faulty_spec(tmp_path, "raise", phase="start")
    on_start = parents_of_workers(parents)
    results = [run_in_worker(spec, tmp_path / f"w{i}", Limits(120), on_start=on_start) for i in range(2)]
    assert [result.outcome for result in results] == [Outcome.ERROR, Outcome.ERROR]
    server_pid = server.process.pid
    assert parents == [server_pid, server_pid], "the workers were spawned, not forked by the server"
    pids = {result.pid for result in results}
    assert len(pids) == 2 and not pids & {os.getpid(), server_pid}


@pytest.mark.parametrize(
    ("kind", "limit_s", "outcome"), [("segfault", 120, Outcome.CRASHED), ("hang", 5, Outcome.TIMEOUT)]
)
def test_a_task_that_crashes_or_hangs_leaves_the_server_serving(tmp_path, server, kind, limit_s, outcome):
    server_pid = server.process.pid
    failed = run_in_worker(faulty_spec(tmp_path, kind, phase="start"), tmp_path / "failed", Limits(limit_s))
    assert failed.outcome == outcome
    assert server.process is not None and server.process.poll() is None
    parents: list[int] = []
    spec = faulty_spec(tmp_path, "raise", phase="start")
    after = run_in_worker(spec, tmp_path / "after", Limits(120), on_start=parents_of_workers(parents))
    assert after.outcome == Outcome.ERROR and "injected failure" in after.message
    assert parents == [server_pid] and server.process.pid == server_pid


def test_the_process_group_of_a_timed_out_task_is_gone(tmp_path, server):
    seen: list[int] = []
    worker: list[int] = []

    def watch_the_group() -> None:
        if worker:
            seen.extend(pid for pid in group_members(worker[0]) if pid not in seen)

    spec = faulty_spec(tmp_path, "hang_with_child", phase="start")
    result = run_in_worker(spec, tmp_path / "w", Limits(8), on_tick=watch_the_group, on_start=worker.append)
    assert result.outcome == Outcome.TIMEOUT
    assert len(seen) >= 2, "the worker's child never showed in its group, so the test proves nothing"
    gone_by = time.monotonic() + 10  # killed with SIGKILL: only their reaping can lag
    while group_members(result.pid):
        assert time.monotonic() < gone_by, f"processes of the timed-out group survived: {group_members(result.pid)}"
        time.sleep(0.1)
    assert server.process.poll() is None


def test_a_server_whose_imports_initialised_cuda_refuses_to_fork():
    """On an H100 with the quantization packages installed, an import in the server initialised CUDA and every
    forked trial failed ("Cannot re-initialize CUDA in forked subprocess"). A CPU has no CUDA to initialise: the
    server here runs with torch.cuda.is_initialized answering True, and must refuse rather than fork."""
    import json
    import subprocess
    import sys

    pretend = (
        "import torch; torch.cuda.is_initialized = lambda: True; "
        "from autotune.worker import forkserver; forkserver.main()"
    )
    request = json.dumps({"spec": "s.json", "result": "r.json", "log": os.devnull, "env": {}})
    done = subprocess.run(
        [sys.executable, "-c", pretend], input=request + "\n", capture_output=True, text=True, timeout=300
    )
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    assert replies[0]["ready"] is True
    assert "CUDA was initialised in the fork server" in replies[1]["refused"]
    assert len(replies) == 2  # nothing forked


def test_a_task_on_a_gpu_is_spawned_never_forked(tmp_path, server):
    """A GPU trial forked from the server failed on the H100 (CUDA poisoned by an import): it is spawned."""
    parents: list[int] = []
    spec = faulty_spec(tmp_path, "raise", phase="start")
    spec.device = "cuda:0"
    result = run_in_worker(spec, tmp_path / "w", Limits(120), on_start=parents_of_workers(parents))
    assert result.outcome == Outcome.ERROR
    assert parents == [os.getpid()], "the GPU task was forked by the server"


def test_a_status_the_server_wrote_with_the_pid_is_read_at_once():
    """A fast task's two messages ({"pid"}, then its status) can come in one read of the pipe. A buffered reader kept
    the second where select() could not see it: the runner then waited for it forever (a .ci/run hung 47 minutes on
    test_an_allocation_that_cannot_be_served_is_an_oom). Here a real process writes both at once."""
    both = 'import sys; sys.stdout.write(\'{"pid": 7}\\n{"pid": 7, "status": 256}\\n\'); sys.stdout.flush(); input()'
    own = ForkServer()
    own.process = subprocess.Popen([sys.executable, "-c", both], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert own.read(30) == {"pid": 7}
        assert fork_client.ForkedWorker(own, 7).wait(timeout=5) == 1  # exit status 1: 256 as a wait status
    finally:
        own._stop()


# ------------------------------------------------------------------ servers forked from a fork template

# A command watches a server it did not start through a pidfd (Linux 5.3): without one it starts its own.
needs_pidfd = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no os.pidfd_open (Linux 5.3 or later)")


@needs_pidfd
def test_a_fork_template_hands_a_command_a_server_whose_tasks_it_forks(tmp_path, fork_template, monkeypatch):
    monkeypatch.setenv(TEMPLATE_VARIABLE, fork_template)  # the module's server fixture may have removed it
    own = ForkServer()
    own.disabled = False
    monkeypatch.setattr(fork_client, "FORK_SERVER", own)
    try:
        assert own._running(), "no fork server"
        assert isinstance(own.process, TemplateServer), "the server was not forked by the template"
        server = psutil.Process(own.process.pid)
        assert fork_template in psutil.Process(server.ppid()).cmdline()  # the template's child, not this process's
        assert Path(server.cwd()) == Path.cwd()  # the command's folder, not the template's
        parents: list[int] = []
        spec = faulty_spec(tmp_path, "raise", phase="start")
        result = run_in_worker(spec, tmp_path / "w", Limits(120), on_start=parents_of_workers(parents))
        assert result.outcome == Outcome.ERROR and "injected failure" in result.message
        assert parents == [server.pid]
    finally:
        own._stop()
    assert not running(server.pid)


def test_a_command_whose_libraries_would_read_another_environment_starts_a_server_of_its_own(
    fork_template, monkeypatch
):
    monkeypatch.setenv(TEMPLATE_VARIABLE, fork_template)
    monkeypatch.setenv("HF_HUB_OFFLINE", "not what the template has")
    own = ForkServer()
    own.disabled = False
    try:
        assert own._running(), "no fork server"
        assert isinstance(own.process, subprocess.Popen), "the template forked a server for another environment"
    finally:
        own._stop()


def test_only_what_the_libraries_read_when_imported_must_agree():
    ours = {"OMP_NUM_THREADS": "1", "HF_HOME": "/a", "AUTOTUNE_CACHE_DIR": "/x", "PYTHONPATH": "/repo"}
    assert import_time_difference({**ours, "AUTOTUNE_CACHE_DIR": "/y", "PYTEST_CURRENT_TEST": "t"}, ours) is None
    assert import_time_difference({**ours, "OMP_NUM_THREADS": "2"}, ours) == "OMP_NUM_THREADS"
    assert import_time_difference({k: v for k, v in ours.items() if k != "PYTHONPATH"}, ours) == "PYTHONPATH"
    assert import_time_difference({**ours, "TORCHINDUCTOR_CACHE_DIR": "/c"}, ours) == "TORCHINDUCTOR_CACHE_DIR"
    # numpy's and scipy's OpenBLAS size their thread pools when loaded (scipy is in the preload of a CPU build)
    assert import_time_difference({**ours, "OPENBLAS_NUM_THREADS": "1"}, ours) == "OPENBLAS_NUM_THREADS"


COMMAND = """
import sys, time
from pathlib import Path
from autotune.process import fork_client
from autotune.process.runner import Limits, run_in_worker
from tests.conftest import REPO
from tests.process.test_runner import faulty_spec
work = Path(sys.argv[1])
run_in_worker(faulty_spec(work, "hang_with_child", phase="start"), work / "w", Limits(600),
              on_start=lambda pid: print(fork_client.FORK_SERVER.process.pid, pid, flush=True))
"""


@needs_pidfd
def test_a_server_forked_from_the_template_ends_with_its_command_and_so_does_the_task(tmp_path, fork_template):
    """Not the command's child, the server cannot die with it by the kernel's word: it sees its pipe close."""
    command = subprocess.Popen(
        [sys.executable, "-c", COMMAND, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), TEMPLATE_VARIABLE: fork_template},
    )  # fmt: skip
    server_pid, worker_pid = map(int, command.stdout.readline().split())
    try:
        assert fork_template in psutil.Process(psutil.Process(server_pid).ppid()).cmdline()
        deadline = time.monotonic() + 60
        while len(group_members(worker_pid)) < 2:  # the hanging task and the child it starts
            assert time.monotonic() < deadline, "the task never started its child"
            time.sleep(0.1)
    finally:
        command.kill()
        command.wait()
    gone_by = time.monotonic() + 10
    while group_members(worker_pid) or running(server_pid):
        assert time.monotonic() < gone_by, "the server or its task outlived the command"
        time.sleep(0.1)


def _template(address: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "autotune.worker.forkserver", "--template", str(address)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def test_a_template_cannot_take_an_address_in_use_or_unusable_and_says_so_in_one_line(tmp_path, fork_template):
    for address, reason in [(fork_template, "another template listens on"),
                            (tmp_path / "no-such-folder" / "socket", "cannot listen on")]:  # fmt: skip
        refused = _template(Path(address))
        _, stderr = refused.communicate(timeout=60)
        assert refused.returncode == 2 and stderr.splitlines() == [stderr.strip()] and reason in stderr, stderr
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as probe:
        probe.connect(fork_template)  # the live template still listens


def test_a_template_takes_the_address_a_dead_one_left(tmp_path):
    address = tmp_path / "socket"
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as dead:
        dead.bind(str(address))  # its file stays, nothing listens
    started = _template(address)
    try:
        deadline = time.monotonic() + 60
        while True:  # it listens before it imports
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as probe:
                try:
                    probe.connect(str(address))
                    break
                except OSError:
                    assert started.poll() is None, started.communicate()
                    assert time.monotonic() < deadline, "the template never listened"
                    time.sleep(0.05)
    finally:
        started.kill()
        started.wait()
