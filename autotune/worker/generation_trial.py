"""The trial of the generation workload kinds (throughput, latency): the model loaded with the plan in this process,
the timed generation (autotune/worker/generation.py), then speed, memory, energy and quality figures."""

from __future__ import annotations

import gc
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from autotune import for_tests
from autotune.figures.capacity import Probe
from autotune.figures.metrics import (
    CAPACITY,
    COST_PER_MILLION_TOKENS,
    E2E_THROUGHPUT,
    GREEDY_AGREEMENT,
    MEETS_SLO_FIGURE,
    PEAK_MEMORY,
    PEAK_MEMORY_BYTES,
    THROUGHPUT,
    TP_RANKS,
    WARMUP,
)
from autotune.figures.quality import DECODE, GENERATE
from autotune.process.results import Outcome, TaskDetails, TaskResult, TaskSpec, WorkloadSpec
from autotune.space import rules
from autotune.space.plan import Plan
from autotune.worker.environment import environment, installed_version
from autotune.worker.extensions import build_library_extensions
from autotune.worker.failures import BrokenOutputError, UnsupportedError, classify
from autotune.worker.generation import Generation, PaddedGeneration, build_inputs, make_generation
from autotune.worker.loading import import_first_call_modules, load_model, load_tokenizer
from autotune.worker.measurement.energy import EnergyCounter, energy_figures
from autotune.worker.measurement.memory import PeakMemory
from autotune.worker.measurement.quality.degenerate import degenerate_figures, eos_ids_of
from autotune.worker.measurement.quality.forced import judged_quality
from autotune.worker.measurement.quality.outputs import broken_reason, prefix_agreement
from autotune.worker.measurement.quality.reference import load_reference
from autotune.worker.measurement.speed import (
    Iteration,
    cost_per_million_tokens,
    decode_bytes_per_step,
    kv_bytes_per_token,
    latency_percentiles,
    roofline,
    speed_figures,
    traffic_figures,
)
from autotune.worker.measurement.timing import repeat_until
from autotune.worker.replay import make_replay
from autotune.worker.tasks import Phases
from autotune.worker.tensor_parallel import ranks_of, shared_clock
from autotune.worker.traffic import ReplayRequest, replay_requests
from autotune.workloads import KINDS


def run(spec: TaskSpec, phases: Phases) -> TaskResult:
    """Load the model with the plan, run the timed generation (warm-up, then measured iterations), check quality.

    With a capacity probe (several batch sizes, autotune/figures/capacity.py), the loaded model measures each
    batch in ascending order until one is past the SLO, out of memory, or predicted not to fit; the trial's figures
    are those of the largest batch that met the SLO.
    """
    assert spec.candidate is not None and spec.reference_path is not None
    planned = spec.candidate.plan
    ranks = ranks_of(planned)
    with phases("load"):
        refuse_what_cannot_run(spec.candidate.config, planned)
        plan = planned
        tokenizer = load_tokenizer(spec.model)
        requests = _replayed(spec, tokenizer)
        for requirement in rules.requirements(spec.candidate.config):
            importlib.import_module(requirement.import_name)  # counts as process baseline, not as model memory
        build_library_extensions(spec.device)
        import_first_call_modules()
        memory = PeakMemory(spec.device)
        model = load_model(spec.model, plan, spec.device)
    for_tests.model_loaded(spec.fault, model)
    sizes = spec.workload.batch_sizes or [KINDS[spec.workload.kind].requests(spec.workload)]
    probe = Probe(sizes, spec.workload.slo, spec.memory_limit_bytes)
    points = _climb(probe, lambda size: _measure_batch(spec, model, plan, tokenizer, size, memory, phases, requests))
    capacity = probe.capacity("batch")
    chosen = points[capacity.chosen.size if capacity.chosen else min(points)]
    workload_spec = replace(spec.workload, batch_size=int(chosen.size))
    with phases("quality"):
        quality, quality_path = _quality(spec, model, plan, tokenizer, chosen, requests)
    speed, stats = speed_figures(chosen.iterations, chosen.warmup[0])
    figures = _roofline_and_cost(spec, model, plan, workload_spec, speed, requests)
    metrics = {**speed, **chosen.latency, **quality, **chosen.memory, **figures}
    metrics |= traffic_figures(chosen.iterations, spec.workload.slo)
    metrics[WARMUP.name] = phases.timings["warmup"]
    if ranks > 1:
        metrics[TP_RANKS] = float(ranks)  # the memory figures are rank 0's: one shard and its share of the work
    metrics |= energy_figures(chosen.joules, sum(len(row) for i in chosen.iterations for row in i.generated))
    details = TaskDetails(plan=plan if plan != planned else None, quality_path=quality_path)
    if spec.workload.batch_sizes or spec.workload.slo:
        found = {
            CAPACITY.name: chosen.size if capacity.chosen else 0.0,
            MEETS_SLO_FIGURE.name: float(bool(capacity.chosen)),
        }
        metrics |= found
        details.capacity = capacity
    return TaskResult(Outcome.OK, metrics=metrics, stats=stats, environment=environment(spec.device), details=details)


@dataclass(frozen=True)
class MeasuredBatch:
    """One batch size measured: its iterations, warm-up, latency percentiles, memory and energy, and the generation
    that ran them (its quality is judged through it)."""

    size: int
    generation: Generation
    iterations: list[Iteration]
    warmup: list[Iteration]
    latency: dict[str, float]
    memory: dict[str, float]
    joules: float | None

    def figures(self) -> dict[str, float]:
        """What the probe judges it by: its speed, its latency percentiles, its peak memory."""
        speed, _ = speed_figures(self.iterations, self.warmup[0])
        return {**speed, **self.latency, PEAK_MEMORY_BYTES: self.memory[PEAK_MEMORY_BYTES]}


def _climb(probe: Probe, measure: Callable[[int], MeasuredBatch]) -> dict[float, MeasuredBatch]:
    """Measure the probe's sizes until it stops; an out-of-memory error ends it (and the trial, at its first size)."""
    measured: dict[float, MeasuredBatch] = {}
    while (size := probe.next_size()) is not None:
        if (skipped := probe.too_big(size)) is not None:
            probe.add(skipped)
            continue
        try:
            point = measure(int(size))
        except BaseException as error:
            if not measured or classify(error, None).outcome != Outcome.OOM:
                raise
            probe.record_oom(size, f"{type(error).__name__}: {error}")
            _free_memory()
            continue
        measured[size] = point
        probe.record(size, point.figures())
    return measured


def _replayed(spec: TaskSpec, tokenizer: Any) -> list[ReplayRequest] | None:
    """The trace's requests every batch size replays (--traffic), as token ids; None for a workload of one shape."""
    traffic = spec.workload.traffic
    return replay_requests(traffic, Path(spec.cache_dir), tokenizer) if traffic else None


def _measure_batch(
    spec: TaskSpec,
    model: Any,
    plan: Plan,
    tokenizer: Any,
    size: int,
    memory: PeakMemory,
    phases: Phases,
    requests: list[ReplayRequest] | None,
) -> MeasuredBatch:
    """One batch size: its generation set up, warmed up, then timed. A trace's window is replayed whole each time:
    one replay warms up (every batch's shapes compiled), and the timing takes at least one."""
    workload = replace(spec.workload, batch_size=size)
    least = workload.min_iterations
    with phases("setup"):
        if requests is not None:
            queued = KINDS[workload.kind].requests_wait
            generation = make_replay(model, plan, requests, workload, size, tokenizer.pad_token_id, queued)
            least = 1
        else:
            inputs = build_inputs(tokenizer, workload, size)
            generation = make_generation(model, plan, inputs, workload, tokenizer.pad_token_id)
    with phases("warmup"):
        warmups = 1 if requests is not None else max(1, workload.warmup_iterations)
        warmup = [generation.run() for _ in range(warmups)]
    with phases("measure"):
        for_tests.batch_measuring(spec.fault, size)
        memory.reset()
        energy = EnergyCounter(spec.device)
        energy.start()
        w = workload
        iterations = repeat_until(generation.run, least, w.min_seconds, w.max_iterations, shared_clock)
        joules = energy.joules()
        peak = memory.peak_bytes()
        generation.close()
    measured = {**memory.details(), PEAK_MEMORY_BYTES: float(peak), PEAK_MEMORY.name: peak / 1e9}
    return MeasuredBatch(size, generation, iterations, warmup, latency_percentiles(iterations), measured, joules)


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def refuse_what_cannot_run(config: dict[str, Any], plan: Plan) -> None:
    """UnsupportedError, with what to install or change, when this environment cannot run the configuration."""
    refused = rules.installation_problem(config, installed_version) or rules.plan_problem(config, plan)
    if refused is not None:
        raise UnsupportedError(refused.message, knob=refused.knob, combination=refused.knob is None)


def _quality(
    spec: TaskSpec, model: Any, plan: Plan, tokenizer: Any, chosen: MeasuredBatch, requests: list[ReplayRequest] | None
) -> tuple[dict[str, float], str]:
    """Broken-output checks; KL, top-1, perplexity and token agreement teacher-forced through the generation that was
    timed (autotune/worker/measurement/quality/); greedy agreement and the degenerate share (tier 0) of its own
    outputs. And the path they came from."""
    generated = chosen.iterations[-1].generated
    reference_greedy = None
    if spec.greedy_reference_path:
        reference_greedy = json.loads(Path(spec.greedy_reference_path).read_text())["generated"][: len(generated)]
    reason = broken_reason(generated, reference_greedy)
    if reason:
        raise BrokenOutputError(reason)
    forced, path = _forced_generation(spec, model, plan, tokenizer, chosen, requests)
    reference = load_reference(Path(spec.reference_path))  # type: ignore[arg-type] - checked in run()
    quality = judged_quality(forced, reference, reference_greedy, model.device)
    if reference_greedy is not None:
        quality[GREEDY_AGREEMENT.name] = prefix_agreement(generated, reference_greedy)
    return quality | degenerate_figures(generated, reference_greedy, eos_ids_of(model)), path


def _forced_generation(
    spec: TaskSpec, model: Any, plan: Plan, tokenizer: Any, chosen: MeasuredBatch, requests: list[ReplayRequest] | None
) -> tuple[PaddedGeneration, str]:
    """The generation the quality is forced through: the timed one itself; a trace's replay, generate() with its plan
    on a batch of its requests (the quality's own shape); under continuous batching, which takes no logits processor,
    generate() on the same model, inputs and settings."""
    if isinstance(chosen.generation, PaddedGeneration):
        return chosen.generation, DECODE
    workload = replace(spec.workload, batch_size=chosen.size)
    if requests is not None:
        inputs = [request.ids for request in requests[: chosen.size]]
        path = GENERATE if plan.batching == "continuous" else DECODE
        return PaddedGeneration(model, plan, inputs, workload, tokenizer.pad_token_id), path
    inputs = build_inputs(tokenizer, workload, chosen.size)
    return PaddedGeneration(model, plan, inputs, workload, tokenizer.pad_token_id), GENERATE


def _roofline_and_cost(
    spec: TaskSpec,
    model: Any,
    plan: Plan,
    workload: WorkloadSpec,
    speed: dict[str, float],
    replayed: list[ReplayRequest] | None,
) -> dict:
    weight_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    config = model.config.get_text_config(decoder=True)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element_bytes = 1 if plan.quantized_kv_cache else torch.finfo(model.dtype).bits // 8
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    kv = kv_bytes_per_token(config.num_hidden_layers, kv_heads, head_dim, element_bytes)
    at_once = KINDS[workload.kind].requests(workload)
    input_len, output_len = _mean_lengths(workload, replayed)
    per_step = decode_bytes_per_step(weight_bytes, kv, at_once, input_len, output_len)
    figures = {"weight_bytes": float(weight_bytes), "decode_bytes_per_step": per_step}
    if spec.bandwidth_gb_s and speed[THROUGHPUT.name] > 0:
        figures |= roofline(speed[THROUGHPUT.name], at_once, per_step, spec.bandwidth_gb_s)
    if spec.price_per_hour is not None and speed[E2E_THROUGHPUT.name] > 0:
        price = spec.price_per_hour
        figures[COST_PER_MILLION_TOKENS.name] = cost_per_million_tokens(price, speed[E2E_THROUGHPUT.name])
    return figures


def _mean_lengths(workload: WorkloadSpec, requests: list[ReplayRequest] | None) -> tuple[float, float]:
    """The input and output length a decoding step's cache is sized by: the workload's, or the trace's means."""
    if not requests:
        return workload.input_len, workload.output_len
    count = len(requests)
    return sum(len(r.ids) for r in requests) / count, sum(r.output_len for r in requests) / count
