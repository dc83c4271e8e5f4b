"""A fork server: import torch and transformers once, then fork one fresh process per task.

Every trial still runs in its own process, with its own memory, its own process group and its own
fate, but it no longer pays the seconds of importing the libraries (docs/measurement.md gives the
split). It serves tasks on a CPU only: a task on a GPU is spawned (autotune.process.runner.forkable:
on an H100 forked trials could not use CUDA). It never starts a thread before forking; if it finds another thread,
or CUDA initialised by an import, it refuses and the runner spawns.

Protocol (JSON lines): the runner writes {"spec", "result", "log", "env"}; the server answers
{"pid": N} once the child runs, then {"pid": N, "status": wait status} when it has ended.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from pathlib import Path

from autotune.process.life import die_with_parent


def _preload() -> None:
    """Import what every trial imports, without running anything (no CUDA, no thread pools)."""
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    from transformers.integrations import hub_kernels  # noqa: F401 - the slowest lazy import

    import autotune.worker.tasks  # noqa: F401


def _child(request: dict, born: float) -> None:
    """In the forked process: become a session leader, log to the trial's file, run the task, exit."""
    from autotune.worker.__main__ import run

    code = 1
    try:
        os.setsid()
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.update(request.get("env", {}))
        die_with_parent(expected_parent=int(request["server"]))
        run(Path(request["spec"]), Path(request["result"]), born)
        code = 0
    except BaseException as error:  # whatever happens, this process must end here
        print(f"autotune worker: {type(error).__name__}: {error}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def unsafe_to_fork() -> str | None:
    """Why a fork now would hand the child a broken process, or None."""
    import torch

    if threading.active_count() != 1:
        return "the fork server has started a thread; it cannot fork safely"
    if torch.cuda.is_initialized():
        return "CUDA was initialised in the fork server (by an import); a forked process cannot use it"
    return None


def _send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    die_with_parent()
    # Importing torch and transformers makes millions of objects that live as long as the process: collecting them as
    # they come took 1 s of the 7.8 s of CPU the preload took. Frozen, the children's collections never scan them.
    gc.disable()
    _preload()
    gc.freeze()
    gc.enable()
    _send({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        request = {**json.loads(line), "server": os.getpid()}
        refusal = unsafe_to_fork()
        if refusal is not None:
            _send({"refused": refusal})
            continue
        born = time.time()
        pid = os.fork()
        if pid == 0:
            _child(request, born)
        _send({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send({"pid": pid, "status": status})


if __name__ == "__main__":
    main()
