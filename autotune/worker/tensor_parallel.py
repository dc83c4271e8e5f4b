"""tp_size: the trial worker launches the ranks with torchrun; every rank runs the same trial, rank 0 reports.

Every rank must join every collective, so all of them load, warm up, measure and check quality alike;
the number of timed iterations follows rank 0's clock (`shared_clock`), so no rank waits for one that
stopped. Peak memory is rank 0's: the figure of one shard, said in the metrics (`tp_ranks`).
The worker runs in its own session; a timeout kills it with torchrun and every rank under it (the
runner collects all descendants, and each rank dies with its torchrun agent).

Entry point of a rank: python -m autotune.worker.rank SPEC.json RESULT.json (autotune/worker/rank.py)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from autotune.process.results import Outcome, TaskResult, TaskSpec, write_json_atomically
from autotune.space.plan import Plan


def ranks_of(plan: Plan) -> int:
    config = plan.load.get("distributed_config")
    return int(config.kwargs.get("tp_size", 1)) if config is not None else 1


def is_rank() -> bool:
    """This process is one of the ranks torchrun started (it sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def is_reporting_rank() -> bool:
    return os.environ.get("RANK", "0") == "0"


def run_ranks(spec: TaskSpec, ranks: int) -> TaskResult:
    """Run the trial on `ranks` ranks under torchrun and return rank 0's result."""
    workdir = Path(spec.cache_dir) / "tensor-parallel" / f"{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, result_path = workdir / "spec.json", workdir / "result.json"
    write_json_atomically(spec_path, spec.to_json())
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
               "-m", "autotune.worker.rank", str(spec_path), str(result_path)]  # fmt: skip
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, check=False)
        if not result_path.exists():
            return TaskResult(Outcome.CRASHED, f"torchrun exited with status {done.returncode} without a result")
        return TaskResult.from_json(json.loads(result_path.read_text()))
    finally:
        for path in (spec_path, result_path):
            path.unlink(missing_ok=True)
        workdir.rmdir()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def shared_clock() -> float:
    """Rank 0's clock on every rank: all ranks take the same decisions from it, in the same order."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return time.perf_counter()
    now = [time.perf_counter()]
    dist.broadcast_object_list(now, src=0)
    return float(now[0])


def rank_device(device: str) -> str:
    """Each rank on its own GPU; on CPU every rank shares the host (gloo)."""
    return f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if device.startswith("cuda") else device


def leave_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
