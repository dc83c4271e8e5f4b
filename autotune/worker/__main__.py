"""Entry point of a trial subprocess: python -m autotune.worker SPEC.json RESULT.json

The study process writes the spec, waits with a timeout, and reads the result. This process is the
only one that imports torch.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path

PARENT_PID_VARIABLE = "AUTOTUNE_PARENT_PID"


def die_with_parent() -> None:
    """Ask Linux to kill this process when the study process dies (it must spawn from a lasting thread)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    expected = os.environ.get(PARENT_PID_VARIABLE)
    if expected and os.getppid() != int(expected):  # the parent died before prctl took effect
        os._exit(1)


def main() -> None:
    die_with_parent()
    spec_path, result_path = Path(sys.argv[1]), Path(sys.argv[2])
    raw_spec = json.loads(spec_path.read_text())
    if (raw_spec.get("fault") or {}).get("kind") == "garbage":
        result_path.write_text("{this is not a result")
        return

    import psutil
    import transformers  # noqa: F401 - imported here so that start-up time covers every library import

    from autotune.results import TaskSpec, write_json_atomically
    from autotune.worker.tasks import run_task

    startup_s = time.time() - psutil.Process().create_time()
    result = run_task(TaskSpec.from_json(raw_spec), startup_s)
    result.pid = os.getpid()
    write_json_atomically(result_path, result.to_json())


if __name__ == "__main__":
    main()
