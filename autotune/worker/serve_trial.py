"""The `serve` workload: measure a configuration as it is deployed, `transformers serve` under load.

The trial worker starts the server on its own cores, waits for /health, drives it with the load of
the workload from the other core, stops it (always), then measures quality with the same plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from autotune.process.results import Outcome, TaskDetails, TaskResult, TaskSpec
from autotune.serving.latency import serve_figures
from autotune.serving.load import Endpoint, RequestRecord, run_load
from autotune.serving.server import (
    ServerError,
    ServerProcess,
    free_port,
    serve_argv,
    split_cores,
    tree_anonymous_bytes,
)
from autotune.space.plan import Plan
from autotune.specs import ServeSpec
from autotune.worker.environment import environment
from autotune.worker.failures import UnsupportedError
from autotune.worker.generation import build_inputs
from autotune.worker.loading import load_model, load_tokenizer
from autotune.worker.measurement.energy import EnergyCounter, energy_figures
from autotune.worker.measurement.quality import compare_with_reference, load_reference

HEALTH_TIMEOUT_S = 600.0
MEMORY_SAMPLE_S = 0.1


def run(spec: TaskSpec, phases: Any) -> TaskResult:
    """The serve workload kind's runner: `transformers serve` started with the plan's flags, driven, stopped."""
    assert spec.candidate is not None and spec.reference_path is not None and spec.workload.serve is not None
    plan = Plan.from_json(spec.candidate.plan)
    _check_servable(plan)
    load = spec.workload.serve
    tokenizer = load_tokenizer(spec.model)
    prompts = [tokenizer.decode(ids) for ids in build_inputs(tokenizer, spec.workload, spec.workload.batch_size)]
    server_cores, client_cores = split_cores()
    argv = serve_argv(spec.model.path, plan.serve_flags, spec.device, load.port or free_port())
    server = ServerProcess(argv, server_cores)
    energy = EnergyCounter(spec.device)
    kill_server = (spec.fault or {}).get("kind") == "kill_server"
    own_cores = os.sched_getaffinity(0)
    try:
        with phases("load"):
            server.start()
            server.wait_healthy(HEALTH_TIMEOUT_S)
        os.sched_setaffinity(0, client_cores)
        with phases("measure"):
            if kill_server:  # the fault tests inject: the server dies as the load starts, whatever its speed
                server.kill()
            cpu_before, started = psutil.Process().cpu_times(), time.perf_counter()
            energy.start()
            records, peak = asyncio.run(_drive(server, spec, prompts))
            joules = energy.joules()
            client_cpu = _cpu_share(cpu_before, time.perf_counter() - started)
            server.check_alive("during the trial")
    finally:
        server.stop()
        os.sched_setaffinity(0, own_cores)
        print(f"transformers serve log (end):\n{server.log_tail()}", file=sys.stderr)
        server.remove_log()
    metrics, stats, levels = serve_figures(records, spec.workload.slo, spec.workload.slo_share)
    with phases("quality"):
        model = load_model(spec.model, plan, spec.device)
        metrics |= compare_with_reference(model, load_reference(Path(spec.reference_path)))
    metrics |= _memory(peak) | energy_figures(joules, _generated_tokens(records))
    metrics |= {"client_cpu_share": client_cpu, "warmup_s": phases.timings["load"]}
    serve = _details(argv, load, spec.workload.slo, levels, server_cores, client_cores)
    details = TaskDetails(serve={**serve, "server_pid": server.process.pid if server.process else None})
    return TaskResult(Outcome.OK, metrics=metrics, stats=stats, environment=environment(spec.device), details=details)


def _check_servable(plan: Plan) -> None:
    if plan.not_servable:
        raise UnsupportedError(f"transformers serve has no flag for: {', '.join(plan.not_servable)}", combination=True)


async def _drive(server: ServerProcess, spec: TaskSpec, prompts: list[str]) -> tuple[list[RequestRecord], int]:
    """Run the load while sampling the server's memory; return the requests and the peak bytes."""
    load: ServeSpec = spec.workload.serve  # type: ignore[assignment]
    # The server knows the model by the name it was started with: the path as given.
    url = f"{server.base_url}/v1/completions"
    target = Endpoint(url, spec.model.path, spec.workload.output_len, load.request_timeout_s)
    peak = [0]
    sampler = asyncio.create_task(_sample_memory(server, peak))
    try:
        records = await run_load(target, prompts, load.mode, load.levels, load.requests_per_level, load.warmup_requests)
    finally:
        sampler.cancel()
    return records, peak[0]


async def _sample_memory(server: ServerProcess, peak: list[int]) -> None:
    assert server.process is not None
    while True:
        with contextlib.suppress(Exception):
            peak[0] = max(peak[0], tree_anonymous_bytes(server.process.pid))
        await asyncio.sleep(MEMORY_SAMPLE_S)


def _cpu_share(before: Any, wall_s: float) -> float:
    """CPU seconds the load client used per second of the load: near 1.0 would mean it was the bottleneck."""
    after = psutil.Process().cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return used / wall_s if wall_s > 0 else 0.0


def _memory(peak: int) -> dict[str, float]:
    return {"peak_memory_bytes": float(peak), "peak_memory_gb": peak / 1e9}


def _generated_tokens(records: list[RequestRecord]) -> float:
    return float(sum(record.tokens for record in records if record.ok))


def _details(
    argv: list[str],
    load: ServeSpec,
    slo: dict[str, float],
    levels: list[dict],
    server_cores: list[int],
    client_cores: list[int],
) -> dict[str, Any]:
    return {
        "command": shlex.join(argv),
        "argv": argv,
        "mode": load.mode,
        "slo": slo,
        "levels": levels,
        "server_cores": server_cores,
        "client_cores": client_cores,
    }


__all__ = ["ServerError", "run"]
