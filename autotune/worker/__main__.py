"""Entry point of a trial subprocess: python -m autotune.worker SPEC.json RESULT.json

The study process writes the spec, waits with a timeout, and reads the result. This process is the
only one that imports torch. The fork server (autotune.worker.forkserver) runs the same `run` in a
process it forks, so that the libraries are imported once per search instead of once per trial.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from autotune import for_tests
from autotune.process.life import die_with_parent


def run(spec_path: Path, result_path: Path, started_at: float) -> None:
    """Run the task of `spec_path` and write its result to `result_path`; `started_at` is the process's birth."""
    import time

    from autotune.process.results import TaskSpec, write_json_atomically

    spec = TaskSpec.from_json(json.loads(spec_path.read_text()))
    if for_tests.garbled_result(spec.fault, result_path):
        return

    import transformers  # noqa: F401 - imported here so that start-up time covers every library import

    from autotune.worker.tasks import perform

    result = perform(spec, time.time() - started_at)
    result.pid = os.getpid()
    write_json_atomically(result_path, result.to_json())


def main() -> None:
    die_with_parent()
    import psutil

    run(Path(sys.argv[1]), Path(sys.argv[2]), psutil.Process().create_time())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the result is written: skip tearing down torch's runtime


if __name__ == "__main__":
    main()
