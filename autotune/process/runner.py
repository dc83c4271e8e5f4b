"""Run one worker task in its own process, with a hard timeout, and read back its result.

A worker that crashes, hangs, or writes no result costs one task: the caller always gets a
TaskResult. The worker runs in a new session, so a timeout kills it and every child it started.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

import autotune
from autotune.process import phases
from autotune.process.life import TEMPLATE_VARIABLE, child_environment, worker_environment
from autotune.process.results import Outcome, TaskResult, TaskSpec, write_json_atomically
from autotune.units import format_bytes, format_duration

log = logging.getLogger(__name__)

POLL_S = 0.25
TERMINATE_GRACE_S = 3.0
LOG_TAIL_CHARS = 4000


@dataclass(frozen=True)
class Limits:
    timeout_s: float  # the task's own limit
    deadline: float | None = None  # time.monotonic() at which the study's budget ends


def run_in_worker(
    spec: TaskSpec,
    workdir: Path,
    limits: Limits,
    on_tick: Callable[[], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> TaskResult:
    """Run `spec` in a worker process; call on_start with its pid, then on_tick about every POLL_S seconds,
    and on_phase with each phase the worker announces in its log (autotune.process.phases).

    The worker is forked by the fork server when it runs, else spawned (`python -m autotune.worker`).
    Must be called from a thread that outlives the task: the worker is killed when its parent thread ends.
    """
    spec_path, result_path, log_path = workdir / "spec.json", workdir / "result.json", workdir / "worker.log"
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        result_path.unlink(missing_ok=True)
        write_json_atomically(spec_path, spec.to_json())
    except OSError as error:  # a full disk, a folder that cannot be written: this task fails, not the study
        return TaskResult(Outcome.ERROR, f"cannot write the task's files in {workdir}: {error.strerror}", phase="start")
    forked = FORK_SERVER.launch(spec_path, result_path, log_path) if forkable(spec.device) else None
    process = forked or _spawn(spec_path, result_path, log_path)
    started = time.monotonic()  # after the fork server's own start (imports once for every task), not before
    try:
        with contextlib.suppress(OSError):  # a full disk: the pid is recorded with the trial anyway (on_start)
            (workdir / "worker.pid").write_text(str(process.pid))
        if on_start is not None:
            on_start(process.pid)
        stopped = _wait(process, started, limits, _watching(log_path, on_phase, on_tick))
    except BaseException:
        _kill_tree(process)
        raise
    finally:
        _kill_leftovers(process)
    result = _interpret(process, stopped, result_path, limits)
    result.pid = result.pid or process.pid
    result.exit_code = process.returncode
    result.timings.setdefault("wall", time.monotonic() - started)
    if not result.ok:
        result.log_tail = _tail(log_path)
        result.message = _with_full_disk(result, workdir)
    return result


FULL_BELOW_BYTES = 64 * 1024  # a disk with less free space cannot take a task's log and result


def _with_full_disk(result: TaskResult, workdir: Path) -> str:
    """A result the worker could not write, or could write only in part, on a full disk says so first."""
    try:
        free = shutil.disk_usage(workdir).free
    except OSError:
        return result.message
    said = "No space left on device" in result.log_tail or "No space left on device" in result.message
    if result.outcome not in (Outcome.CRASHED, Outcome.ERROR) or not (said or free < FULL_BELOW_BYTES):
        return result.message
    where = f"{format_bytes(free)} free where the task writes its files ({workdir})"
    return f"no space left on device: {where}; {result.message}"


def _watching(
    log_path: Path, on_phase: Callable[[str], None] | None, on_tick: Callable[[], None] | None
) -> Callable[[], None] | None:
    """on_tick, preceded by reading the phases the worker announced since the last tick."""
    if on_phase is None:
        return on_tick
    watcher = PhaseWatcher(log_path, on_phase)

    def tick() -> None:
        watcher.poll()
        if on_tick is not None:
            on_tick()

    return tick


class PhaseWatcher:
    """Reads a growing worker log and reports each phase line once."""

    def __init__(self, log_path: Path, on_phase: Callable[[str], None]) -> None:
        self.log_path = log_path
        self.on_phase = on_phase
        self.offset = 0
        self.partial = b""

    def poll(self) -> None:
        try:
            with self.log_path.open("rb") as log_file:
                log_file.seek(self.offset)
                data = log_file.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            name = phases.parse(line.decode(errors="replace"))
            if name is not None:
                self.on_phase(name)


def _spawn(spec_path: Path, result_path: Path, log_path: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "autotune.worker", str(spec_path), str(result_path)]
    with log_path.open("wb") as log_file:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=_worker_environment(),
        )


class ForkedWorker:
    """A worker forked by the fork server, seen through the same poll/wait as a Popen."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read_status(timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
            self._read_status(timeout=left)
        return self.returncode

    def _read_status(self, timeout: float | None) -> None:
        message = self.server.read(timeout)
        if message is None:
            return
        if message.get("lost"):  # the server died, and its children with it
            self.returncode = -signal.SIGKILL
        elif message.get("pid") == self.pid and "status" in message:
            self.returncode = os.waitstatus_to_exitcode(message["status"])


def forkable(device: str) -> bool:
    """Whether a task on this device may be forked from the fork server. Not a GPU's: on an H100 with the quantization
    packages installed, every forked trial failed ("Cannot re-initialize CUDA in forked subprocess") while
    `torch.cuda.is_initialized()` was false in the server, so no check there can be trusted to catch it. A GPU trial
    takes tens of seconds; the imports a spawned worker repeats take a few (about 5 s on that machine)."""
    return not device.startswith("cuda")


class ForkServer:
    """The study process's fork server (autotune.worker.forkserver), started on first use."""

    START_TIMEOUT_S = 120.0

    def __init__(self) -> None:
        self.process: subprocess.Popen | TemplateServer | None = None
        self.pending = b""  # what the server wrote past the last whole line read
        self.disabled = os.environ.get("AUTOTUNE_FORK_SERVER", "1") == "0"

    def launch(self, spec_path: Path, result_path: Path, log_path: Path) -> ForkedWorker | None:
        """Fork a worker for this task, or None when no fork server can run (the caller spawns one)."""
        if self.disabled or not self._running():
            return None
        request = {"spec": str(spec_path), "result": str(result_path), "log": str(log_path),
                   "env": _worker_environment()}  # fmt: skip
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
        except OSError:
            self._stop()
            return None
        reply = self.read(self.START_TIMEOUT_S)
        if reply is None or "pid" not in reply:
            log.warning("the fork server did not fork (%s); spawning workers instead", reply)
            self._stop()
            self.disabled = "refused" in (reply or {})  # it would refuse again: not started anew for every task
            return None
        return ForkedWorker(self, reply["pid"])

    def read(self, timeout: float | None) -> dict | None:
        """The server's next message; {"lost": True} if it died; None if nothing came within `timeout`.

        Lines are split here from what the pipe gave: a buffered reader would keep a second message (a fast task's
        status, written right after its pid) where select() cannot see it, and the wait for it would never end."""
        assert self.process is not None and self.process.stdout is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.process.stdout], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                self._stop()
                return {"lost": True}
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def _running(self) -> bool:
        if self.process is not None and self.process.poll() is None:
            return True
        self.process = self._from_template() or self._started()
        if self.process is None:
            self.disabled = True
            return False
        self.pending = b""
        ready = self.read(self.START_TIMEOUT_S)
        if not ready or not ready.get("ready"):
            log.warning("the fork server did not start; spawning workers instead")
            self._stop()
            self.disabled = True
            return False
        return True

    def _started(self) -> subprocess.Popen | None:
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "autotune.worker.forkserver"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in the terminal is the study's to handle, not the server's
                env=_worker_environment(),
            )
        except OSError:
            return None

    def _from_template(self) -> TemplateServer | None:
        """A fork server forked by the fork template AUTOTUNE_FORK_TEMPLATE names, if one runs and agrees to."""
        address = os.environ.get(TEMPLATE_VARIABLE)
        if not address or not hasattr(os, "pidfd_open"):  # a server not its child is watched through a pidfd
            return None
        server_in, runner_out = os.pipe()
        runner_in, server_out = os.pipe()
        request = {"env": _worker_environment(), "cwd": str(Path.cwd()), "executable": sys.executable,
                   "package": str(Path(autotune.__file__).parent)}  # fmt: skip
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as connection:
                connection.settimeout(self.START_TIMEOUT_S)
                connection.connect(address)
                socket.send_fds(connection, [json.dumps(request).encode()], [server_in, server_out])
                reply = json.loads(connection.recv(65536) or b"{}")
        except (OSError, ValueError) as error:
            reply = {"refused": f"no fork template answers at {address} ({error})"}
        finally:
            os.close(server_in)
            os.close(server_out)
        try:
            if "pid" in reply:
                return TemplateServer(reply["pid"], runner_out, runner_in)
        except OSError as error:  # it died at once
            reply = {"refused": f"the server {reply['pid']} the template forked is gone ({error})"}
        log.info("starting a fork server of its own: %s", reply.get("refused", reply))
        os.close(runner_in)
        os.close(runner_out)
        return None

    def _stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            self.process.wait()
        self.process = None


class TemplateServer:
    """A fork server the fork template forked for this process, seen through the same stdin, stdout, poll, kill and
    wait as a Popen; not this process's child, so through a pidfd."""

    def __init__(self, pid: int, stdin: int, stdout: int) -> None:
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)  # first: if it fails, the caller still owns the pipes
        self.stdin = os.fdopen(stdin, "wb")
        self.stdout = os.fdopen(stdout, "rb", buffering=0)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.pidfd], [], [], 0)[0]:
            self.returncode = -1  # ended; its status is its parent's, the template's, to read
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def wait(self) -> int:
        select.select([self.pidfd], [], [])
        self.poll()
        for each in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                each.close()
        with contextlib.suppress(OSError):
            os.close(self.pidfd)
        return -1


FORK_SERVER = ForkServer()


def _worker_environment() -> dict[str, str]:
    return child_environment(worker_environment(dict(os.environ)))


def _wait(
    process: subprocess.Popen | ForkedWorker, started: float, limits: Limits, on_tick: Callable[[], None] | None
) -> Outcome | None:
    """Wait for the worker; stop it at its timeout or at the budget's deadline and say which."""
    while True:
        try:
            process.wait(timeout=POLL_S)
            return None
        except subprocess.TimeoutExpired:
            pass
        if on_tick is not None:
            on_tick()
        now = time.monotonic()
        if limits.deadline is not None and now >= limits.deadline:
            _kill_tree(process)
            return Outcome.BUDGET
        if now - started >= limits.timeout_s:
            _kill_tree(process)
            return Outcome.TIMEOUT


def _kill_tree(process: subprocess.Popen | ForkedWorker) -> None:
    """SIGTERM the worker's process group and every descendant, then SIGKILL what is left."""
    victims = _descendants(process.pid)
    _signal_group(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=TERMINATE_GRACE_S)
    _signal_group(process.pid, signal.SIGKILL)
    for victim in victims:
        with contextlib.suppress(psutil.Error):
            victim.kill()
    process.wait()


def _kill_leftovers(process: subprocess.Popen | ForkedWorker) -> None:
    """After the worker ended, kill children it left behind in its group (compile workers, ...)."""
    if process.poll() is None:
        _kill_tree(process)
    else:
        _signal_group(process.pid, signal.SIGKILL)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _interpret(
    process: subprocess.Popen | ForkedWorker, stopped: Outcome | None, result_path: Path, limits: Limits
) -> TaskResult:
    if stopped == Outcome.TIMEOUT:
        return TaskResult(
            Outcome.TIMEOUT,
            f"no result within the trial timeout of {format_duration(limits.timeout_s)}; "
            "the worker and its children were killed",
        )
    if stopped == Outcome.BUDGET:
        return TaskResult(Outcome.BUDGET, "stopped when the study's budget ran out")
    code = process.returncode
    if result_path.exists():
        try:
            return TaskResult.from_json(json.loads(result_path.read_text()))
        except (ValueError, KeyError, TypeError) as error:
            return TaskResult(Outcome.CRASHED, f"the worker wrote a malformed result ({error}); exit status {code}")
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        hint = " (the kernel's out-of-memory killer sends SIGKILL)" if name == "SIGKILL" else ""
        return TaskResult(Outcome.CRASHED, f"the worker was killed by {name}{hint}")
    return TaskResult(Outcome.CRASHED, f"the worker exited with status {code} without a result")


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as file:
            file.seek(max(0, path.stat().st_size - LOG_TAIL_CHARS))
            return file.read().decode(errors="replace")
    except OSError:
        return ""
