"""The study process's side of the fork server (autotune/worker/forkserver.py): a worker forked from a server that
imported torch and transformers once, seen through the same poll and wait as a spawned one; the server started on first
use, or forked by a fork template (AUTOTUNE_FORK_TEMPLATE names its socket) that a command's servers are forked from.
The runner (runner.py) asks it for a worker and spawns one where it cannot fork."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import autotune
from autotune.process.life import TEMPLATE_VARIABLE, worker_child_environment

log = logging.getLogger(__name__)


def forkable(device: str) -> bool:
    """Whether a task on this device may be forked from the fork server. Not a GPU's: on an H100 with the quantization
    packages installed, every forked trial failed ("Cannot re-initialize CUDA in forked subprocess") while
    `torch.cuda.is_initialized()` was false in the server, so no check there can be trusted to catch it. A GPU trial
    takes tens of seconds; the imports a spawned worker repeats take a few (about 5 s on that machine)."""
    return not device.startswith("cuda")


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
                   "env": worker_child_environment()}  # fmt: skip
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
                env=worker_child_environment(),
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
        request = {"env": worker_child_environment(), "cwd": str(Path.cwd()), "executable": sys.executable,
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
