"""What a parent and the processes it starts agree on about their lives: a child dies with its parent.

The study process starts workers (and `search --devices` starts `autotune worker`s) with PARENT_PID_VARIABLE
set to its pid; the child asks Linux to kill it when its parent dies, and checks that the parent it names is
still the one it has, in case the parent died before the request took effect.
"""

from __future__ import annotations

import ctypes
import os
import signal

PARENT_PID_VARIABLE = "AUTOTUNE_PARENT_PID"
TEMPLATE_VARIABLE = "AUTOTUNE_FORK_TEMPLATE"  # the socket of a fork template (autotune.worker.forkserver) to fork from
_PR_SET_PDEATHSIG = 1


def kill_with_parent() -> None:
    """Ask Linux to send SIGKILL to this process when its parent dies (safe between fork and exec)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def die_with_parent(expected_parent: int | None = None) -> None:
    """Die when the parent dies; exit now if it has died already (the parent must spawn from a lasting thread).

    `expected_parent` defaults to the pid in PARENT_PID_VARIABLE, when the parent set it.
    """
    kill_with_parent()
    if expected_parent is None and os.environ.get(PARENT_PID_VARIABLE):
        expected_parent = int(os.environ[PARENT_PID_VARIABLE])
    if expected_parent is not None and os.getppid() != expected_parent:  # it died before prctl took effect
        os._exit(1)


def child_environment(environment: dict[str, str]) -> dict[str, str]:
    """`environment` with this process named as the parent its child must die with."""
    return {**environment, PARENT_PID_VARIABLE: str(os.getpid())}


def worker_environment(environment: dict[str, str]) -> dict[str, str]:
    """`environment` as a worker runs in it: quiet libraries, unbuffered output."""
    quiet = {
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    }
    return {**quiet, **environment, "PYTHONUNBUFFERED": "1"}


def worker_child_environment() -> dict[str, str]:
    """This process's environment as a worker it starts runs in: quiet libraries, unbuffered output, and this process
    named as the parent the worker dies with."""
    return child_environment(worker_environment(dict(os.environ)))
