"""Entry point of one tensor-parallel rank, started by torchrun (autotune.worker.tensor_parallel.run_ranks):
python -m autotune.worker.rank SPEC.json RESULT.json

Every rank runs the same trial task; rank 0 writes the result.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from autotune.process.life import die_with_parent
from autotune.process.results import TaskSpec, write_json_atomically
from autotune.worker.tensor_parallel import is_reporting_rank, leave_group, rank_device


def main() -> None:
    die_with_parent(expected_parent=os.getppid())  # the torchrun agent
    started = time.time()
    spec_path, result_path = Path(sys.argv[1]), Path(sys.argv[2])
    spec = TaskSpec.from_json(json.loads(spec_path.read_text()))
    spec.device = rank_device(spec.device)

    from autotune.worker.tasks import perform  # torch and transformers: after the request to die with the agent

    result = perform(spec, time.time() - started)
    result.pid = os.getpid()
    if is_reporting_rank():
        write_json_atomically(result_path, result.to_json())
    leave_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
