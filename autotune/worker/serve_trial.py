"""The `serve` workload: measure a configuration as it is deployed, `transformers serve` under load.

The trial worker starts the server on its own cores, waits for /health, drives it with the load of
the workload from the other core, level by level (each listed level, or a capacity bracket), stops it
(always), then measures quality with the same plan. With an SLO, the trial's figures are those of its
capacity: the highest level whose requests met the SLO in the share the workload asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from autotune import for_tests
from autotune.figures.capacity import Capacity, Probe
from autotune.figures.metrics import (
    CAPACITY,
    COST_PER_MILLION_TOKENS,
    MEETS_SLO_FIGURE,
    PEAK_MEMORY,
    PEAK_MEMORY_BYTES,
    REQUESTS_PER_S,
    THROUGHPUT,
    WARMUP,
)
from autotune.figures.quality import SERVED
from autotune.process.results import Outcome, TaskDetails, TaskResult, TaskSpec
from autotune.serving.latency import serve_figures
from autotune.serving.levels import measure_levels
from autotune.serving.load import Endpoint, RequestRecord, Requests
from autotune.serving.server import (
    ServerError,
    ServerProcess,
    free_port,
    serve_argv,
    split_cores,
    tree_anonymous_bytes,
)
from autotune.space.plan import Plan
from autotune.worker.environment import environment
from autotune.worker.failures import UnsupportedError
from autotune.worker.generation import PaddedGeneration, build_inputs
from autotune.worker.loading import load_model, load_tokenizer
from autotune.worker.measurement.energy import EnergyCounter, energy_figures
from autotune.worker.measurement.quality.degenerate import degenerate_figures, eos_ids_of
from autotune.worker.measurement.quality.forced import judged_quality
from autotune.worker.measurement.quality.reference import load_reference
from autotune.worker.measurement.speed import cost_per_million_tokens
from autotune.worker.traffic import replay_requests
from autotune.workloads.serve import ServeDetails, ServeSpec, level_probe, level_requests

HEALTH_TIMEOUT_S = 600.0
MEMORY_SAMPLE_S = 0.1


def run(spec: TaskSpec, phases: Any) -> TaskResult:
    """The serve workload kind's runner: `transformers serve` started with the plan's flags, driven, stopped."""
    assert spec.candidate is not None and spec.reference_path is not None and spec.workload.serve is not None
    plan = spec.candidate.plan
    _check_servable(plan)
    load = ServeSpec.of(spec.workload)
    tokenizer = load_tokenizer(spec.model)
    requests = _requests(spec, tokenizer)
    server_cores, client_cores = split_cores()
    argv = serve_argv(spec.model.path, plan.serve_flags, spec.device, load.port or free_port())
    server = ServerProcess(argv, server_cores)
    probe = level_probe(spec.workload)
    records, joules, client_cpu = _serve(server, spec, requests, probe, client_cores, phases)
    slo = spec.workload.slo
    capacity = probe.capacity(load.mode)
    at = _at(capacity, slo)
    metrics, stats, levels = serve_figures(records, slo, at)
    with phases("quality"):  # the server exposes no logits: the served configuration, through generate() here
        metrics |= _quality(spec, plan, tokenizer)
    metrics |= _memory(capacity, at) | energy_figures(joules, _generated_tokens(records))
    metrics |= {"client_cpu_share": client_cpu, WARMUP.name: phases.timings["load"]}
    if spec.price_per_hour is not None and metrics[THROUGHPUT.name] > 0:  # at the trial's level, as its throughput
        price = spec.price_per_hour
        metrics[COST_PER_MILLION_TOKENS.name] = cost_per_million_tokens(price, metrics[THROUGHPUT.name])
    served = ServeDetails(
        shlex.join(argv),
        argv,
        load.mode,
        slo,
        load.bracket,  # a capacity bracket (lowest, highest level), else None: the levels listed
        _judged(levels, capacity, bool(slo)),
        server_cores,
        client_cores,
        server.process.pid if server.process else None,
    )
    details = TaskDetails(workload=served, quality_path=SERVED)
    if slo:
        chosen = capacity.chosen
        metrics |= {CAPACITY.name: chosen.size if chosen else 0.0, MEETS_SLO_FIGURE.name: float(chosen is not None)}
        details.capacity = capacity
    return TaskResult(Outcome.OK, metrics=metrics, stats=stats, environment=environment(spec.device), details=details)


def _requests(spec: TaskSpec, tokenizer: Any) -> Requests:
    """What the load sends: a trace's requests (--traffic), each with its own length and arrival, or the workload's
    prompts, each asking for its output length."""
    if spec.workload.traffic is None:
        inputs = build_inputs(tokenizer, spec.workload, spec.workload.batch_size)
        return Requests.alike([tokenizer.decode(ids) for ids in inputs], spec.workload.output_len)
    replayed = replay_requests(spec.workload.traffic, Path(spec.cache_dir), tokenizer)
    arrivals = [request.arrival_s for request in replayed]
    return Requests(
        [tokenizer.decode(request.ids) for request in replayed],
        [request.output_len for request in replayed],
        None if None in arrivals else arrivals,  # type: ignore[arg-type]
    )


def _serve(
    server: ServerProcess, spec: TaskSpec, requests: Requests, probe: Probe, client_cores: list[int], phases: Any
) -> tuple[list[RequestRecord], float | None, float]:
    """Start the server, drive it through the probe's levels from the client's cores, stop it: the requests' records,
    the joules the device spent, and the client's share of its cores."""
    energy = EnergyCounter(spec.device)
    own_cores = os.sched_getaffinity(0)
    try:
        with phases("load"):
            server.start()
            server.wait_healthy(HEALTH_TIMEOUT_S)
        os.sched_setaffinity(0, client_cores)
        with phases("measure"):
            for_tests.load_starting(spec.fault, server)
            cpu_before, started = psutil.Process().cpu_times(), time.perf_counter()
            energy.start()
            records = asyncio.run(_drive(server, spec, requests, probe))
            if probe.points and probe.points[0].verdict == "failed":  # it fell over at once: no level to keep
                server.check_alive("during the trial")
            joules = energy.joules()
            client_cpu = _cpu_share(cpu_before, time.perf_counter() - started)
    finally:
        server.stop()
        os.sched_setaffinity(0, own_cores)
        print(f"transformers serve log (end):\n{server.log_tail()}", file=sys.stderr)
        server.remove_log()
    return records, joules, client_cpu


def _quality(spec: TaskSpec, plan: Plan, tokenizer: Any) -> dict[str, float]:
    """KL, top-1, perplexity and token agreement of the served configuration, loaded here and forced through
    generate() one prompt at a time, and the degenerate share (tier 0) of its own greedy generation of the first
    prompt, to the first request's own length under a trace (autotune/worker/measurement/quality/)."""
    model = load_model(spec.model, plan, spec.device)
    pad = tokenizer.pad_token_id
    if spec.workload.traffic is not None:
        first = replay_requests(spec.workload.traffic, Path(spec.cache_dir), tokenizer)[0]
        inputs, lengths = [first.ids], [first.output_len]
    else:
        inputs, lengths = build_inputs(tokenizer, spec.workload, 1), None
    forced = PaddedGeneration(model, plan, inputs, spec.workload, pad)
    reference = load_reference(Path(spec.reference_path))  # type: ignore[arg-type] - checked in run()
    greedy = None
    if spec.greedy_reference_path:
        greedy = json.loads(Path(spec.greedy_reference_path).read_text())["generated"]
    generated = PaddedGeneration(model, plan, inputs, spec.workload, pad, lengths).call().generated
    degenerate = degenerate_figures(generated, greedy, eos_ids_of(model))
    return judged_quality(forced, reference, greedy, model.device) | degenerate


def _at(capacity: Capacity, slo: dict[str, float]) -> float | None:
    """The level whose figures are the trial's: its capacity; with no level within the SLO, the lowest measured (the
    trial is off the front); without an SLO, none (every level counts)."""
    if not slo:
        return None
    if capacity.chosen is not None:
        return capacity.chosen.size
    return next((point.size for point in capacity.points if point.figures.get(REQUESTS_PER_S.name)), None)


def _judged(levels: list[dict[str, Any]], capacity: Capacity, slo: bool) -> list[dict[str, Any]]:
    """Each level's figures with its peak memory, and with an SLO its verdict (met, or why it was refused)."""
    points = {point.size: point for point in capacity.points}
    judged = []
    for level in levels:
        point = points[level["load"]]
        memory = {PEAK_MEMORY_BYTES: point.figures.get(PEAK_MEMORY_BYTES, 0.0)}
        verdict = {"verdict": point.verdict, "reason": point.reason} if slo else {}
        judged.append({**level, **memory, **verdict})
    return judged


def _check_servable(plan: Plan) -> None:
    if plan.not_servable:
        raise UnsupportedError(f"transformers serve has no flag for: {', '.join(plan.not_servable)}", combination=True)


async def _drive(server: ServerProcess, spec: TaskSpec, requests: Requests, probe: Probe) -> list[RequestRecord]:
    """Run the levels while sampling the server's memory; return every request sent."""
    load = ServeSpec.of(spec.workload)
    # The server knows the model by the name it was started with: the path as given.
    url = f"{server.base_url}/v1/completions"
    target = Endpoint(url, spec.model.path, load.request_timeout_s)
    watch = ServerWatch(server)
    sampler = asyncio.create_task(watch.sample())
    try:
        requests_at = partial(level_requests, spec.workload)
        return await measure_levels(target, requests, load.mode, probe, watch, requests_at, load.warmup_requests)
    finally:
        sampler.cancel()


class ServerWatch:
    """The server beside the load: its peak memory per level, and whether it still runs."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.peak = 0

    async def sample(self) -> None:
        while True:
            self.peak = max(self.peak, self._now())
            await asyncio.sleep(MEMORY_SAMPLE_S)

    def _now(self) -> int:
        assert self.server.process is not None
        with contextlib.suppress(Exception):
            return tree_anonymous_bytes(self.server.process.pid)
        return 0

    def begin(self) -> None:
        self.peak = self._now()

    def figures(self) -> dict[str, float]:
        return {PEAK_MEMORY_BYTES: float(max(self.peak, self._now()))}

    def failure(self) -> str | None:
        try:
            self.server.check_alive("during the trial")
        except ServerError as error:
            return str(error)
        return None


def _cpu_share(before: Any, wall_s: float) -> float:
    """CPU seconds the load client used per second of the load: near 1.0 would mean it was the bottleneck."""
    after = psutil.Process().cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return used / wall_s if wall_s > 0 else 0.0


def _memory(capacity: Capacity, at: float | None) -> dict[str, float]:
    """The server's peak memory at the trial's level, else over every level."""
    peaks = [point.figures.get(PEAK_MEMORY_BYTES, 0.0) for point in capacity.points if at in (None, point.size)]
    peak = max(peaks, default=0.0)
    return {PEAK_MEMORY_BYTES: peak, PEAK_MEMORY.name: peak / 1e9}


def _generated_tokens(records: list[RequestRecord]) -> float:
    return float(sum(record.tokens for record in records if record.ok))


__all__ = ["ServerError", "run"]
