"""A worker's process tree killed: SIGTERM to its process group and every descendant (compile workers, a server, the
ranks of tensor parallelism), SIGKILL to what is left after a grace period; or, once the worker ended, the children it
left behind in its group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Protocol

import psutil

TERMINATE_GRACE_S = 3.0


class Child(Protocol):
    """A started worker: a Popen, or a worker the fork server forked (fork_client.ForkedWorker)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def kill_tree(process: Child) -> None:
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


def kill_leftovers(process: Child) -> None:
    """After the worker ended, kill children it left behind in its group (compile workers, ...)."""
    if process.poll() is None:
        kill_tree(process)
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
