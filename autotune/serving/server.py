"""`transformers serve` as a child process: started pinned to its cores, on a free port, and always stopped.

The server runs in its own process group and dies with the process that started it, so neither a
finished nor a killed trial leaves it running.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from autotune.extras import install_line
from autotune.process.life import kill_with_parent

HOST = "127.0.0.1"
PROGRAM = "transformers"
HEALTH_POLL_S = 0.2
STOP_GRACE_S = 5.0
LOG_TAIL_BYTES = 1500  # well inside the trial's own log tail (runner.LOG_TAIL_CHARS bytes), header included
_BIND_FAILURE = re.compile(r"address already in use|error while attempting to bind", re.IGNORECASE)


class ServerError(RuntimeError):
    """The server did not come up, or it died while it was measured; the message says why."""


def free_port(host: str = HOST) -> int:
    """A port nothing listens on now: bind port 0 and let the system choose."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def bind_problem(port: int, host: str = HOST) -> str | None:
    """Why `port` cannot be bound on `host` now, or None when it can."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.strerror or str(error)
    return None


def program_path() -> str | None:
    """The `transformers` command of this interpreter's environment, else the one on PATH."""
    beside = Path(sys.executable).parent / PROGRAM
    return str(beside) if beside.exists() else shutil.which(PROGRAM)


def serve_argv(model: str, flags: list[str], device: str, port: int, host: str = HOST) -> list[str]:
    """The command line: the plan's serve flags, the device, and where to listen."""
    return [PROGRAM, "serve", model, *flags, "--device", device, "--host", host, "--port", str(port)]


def split_cores() -> tuple[list[int], list[int]]:
    """Cores for the server and for the load client: the client gets the last core, the server the rest.

    With one core they share it (and the figures say so through the client's CPU use).
    """
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return cores, cores
    return cores[:-1], cores[-1:]


class ServerProcess:
    """One `transformers serve` process: start, wait until healthy, watch, stop."""

    def __init__(self, argv: list[str], cores: list[int]) -> None:
        self.argv = argv
        self.cores = cores
        self.port = int(argv[argv.index("--port") + 1])
        self.host = argv[argv.index("--host") + 1]
        self.process: subprocess.Popen | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="autotune-serve-", suffix=".log")[1])

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        """Start the server on its cores: it inherits this process's affinity, set for the moment of the start."""
        program = program_path()
        if program is None:
            raise ServerError(f"the `transformers` command is not installed here; {install_line('serve')}")
        env = {**os.environ, "OMP_NUM_THREADS": str(len(self.cores)), "TOKENIZERS_PARALLELISM": "false"}
        mine = os.sched_getaffinity(0)
        os.sched_setaffinity(0, self.cores)
        try:
            with self.log_path.open("wb") as log:
                self.process = subprocess.Popen(  # preexec_fn only calls prctl
                    self.argv,
                    executable=program,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=env,
                    preexec_fn=kill_with_parent,
                )
        finally:
            os.sched_setaffinity(0, mine)

    def wait_healthy(self, timeout_s: float) -> float:
        """Wait until /health answers; return how long it took. ServerError if it exits or never answers."""
        assert self.process is not None
        started = time.monotonic()
        with httpx.Client(timeout=HEALTH_POLL_S * 5, trust_env=False) as client:  # never through HTTP_PROXY
            while time.monotonic() - started < timeout_s:
                if self.process.poll() is not None:
                    raise ServerError(self._exit_reason("before it answered /health"))
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return time.monotonic() - started
                time.sleep(HEALTH_POLL_S)
        raise ServerError(f"transformers serve did not answer /health within {timeout_s:.0f}s; {self._log_end()}")

    def check_alive(self, when: str) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise ServerError(self._exit_reason(when))

    def kill(self) -> None:
        """Kill the server at once and reap it (tests: a server that dies during the trial)."""
        assert self.process is not None
        self._signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        """SIGTERM its process group, SIGKILL what is left after a grace period, and reap it."""
        if self.process is None:
            return
        leftovers = _descendants(self.process.pid)
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait()
        self._signal(signal.SIGKILL)  # anything of its group still there
        for child in leftovers:
            with contextlib.suppress(psutil.Error):
                child.kill()

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_bytes()[-LOG_TAIL_BYTES:].decode(errors="replace")
        return ""

    def remove_log(self) -> None:
        self.log_path.unlink(missing_ok=True)

    def _signal(self, signum: int) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def _exit_reason(self, when: str) -> str:
        assert self.process is not None
        code = self.process.returncode
        how = f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exited ({code})"
        if _BIND_FAILURE.search(self.log_tail()):
            return (
                f"transformers serve could not bind {self.host}:{self.port} (address already in use) and {how}; "
                "pass a free --serve-port, or leave it out to use a free one"
            )
        return f"transformers serve {how} {when}; {self._log_end()}"

    def _log_end(self) -> str:
        lines = [line for line in self.log_tail().splitlines() if line.strip()]
        return "its log ends: " + " | ".join(lines[-3:]) if lines else "it logged nothing"


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def tree_anonymous_bytes(pid: int) -> int:
    """Anonymous resident memory of a process and its children (weights, caches; not shared libraries)."""
    total = 0
    for process in [psutil.Process(pid), *_descendants(pid)]:
        with contextlib.suppress(psutil.Error, OSError, ValueError):
            status = Path(f"/proc/{process.pid}/status").read_text()
            match = re.search(r"^RssAnon:\s+(\d+) kB", status, re.MULTILINE)
            total += int(match[1]) * 1024 if match else 0
    return total
