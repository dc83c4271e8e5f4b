"""The trial of the generation workload kinds (throughput, latency): the model loaded with the plan in this process,
the timed generation (autotune/worker/generation.py), then speed, memory, energy and quality figures."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import torch

from autotune.process.results import Outcome, TaskDetails, TaskResult, TaskSpec, WorkloadSpec
from autotune.space import rules
from autotune.space.plan import Plan
from autotune.worker.environment import environment, installed_version
from autotune.worker.extensions import build_library_extensions
from autotune.worker.failures import BrokenOutputError, UnsupportedError
from autotune.worker.generation import build_inputs, entered, make_generation
from autotune.worker.loading import import_first_call_modules, load_model, load_tokenizer
from autotune.worker.measurement.energy import EnergyCounter, energy_figures
from autotune.worker.measurement.memory import PeakMemory
from autotune.worker.measurement.quality import broken_reason, compare_with_reference, load_reference, prefix_agreement
from autotune.worker.measurement.speed import (
    cost_per_million_tokens,
    decode_bytes_per_step,
    kv_bytes_per_token,
    roofline,
    speed_figures,
)
from autotune.worker.measurement.timing import repeat_until
from autotune.worker.tasks import Phases
from autotune.worker.tensor_parallel import ranks_of, shared_clock
from autotune.workloads import KINDS


def run(spec: TaskSpec, phases: Phases) -> TaskResult:
    """Load the model with the plan, run the timed generation (warm-up, then measured iterations), check quality."""
    assert spec.candidate is not None and spec.reference_path is not None
    planned = Plan.from_json(spec.candidate.plan)
    workload_spec = spec.workload
    ranks = ranks_of(planned)
    with phases("load"):
        refuse_what_cannot_run(spec.candidate.config, planned)
        plan = planned
        tokenizer = load_tokenizer(spec.model)
        for requirement in rules.requirements(spec.candidate.config):
            importlib.import_module(requirement.import_name)  # counts as process baseline, not as model memory
        build_library_extensions(spec.device)
        import_first_call_modules()
        memory = PeakMemory(spec.device)
        model = load_model(spec.model, plan, spec.device)
    inputs = build_inputs(tokenizer, workload_spec, KINDS[workload_spec.kind].requests(workload_spec))
    with phases("setup"):
        workload = make_generation(model, plan, inputs, workload_spec, tokenizer.pad_token_id)
    with phases("warmup"):
        warmup = [workload.run() for _ in range(max(1, workload_spec.warmup_iterations))]
    with phases("measure"):
        memory.reset()
        energy = EnergyCounter(spec.device)
        energy.start()
        w = workload_spec
        iterations = repeat_until(workload.run, w.min_iterations, w.min_seconds, w.max_iterations, shared_clock)
        joules = energy.joules()
        peak = memory.peak_bytes()
        workload.close()
    with phases("quality"), entered(plan.contexts):  # the forward passes run as generate() did (precision, kernel)
        quality = _quality(spec, model, iterations[-1].generated)
    speed, stats = speed_figures(iterations, warmup[0])
    figures = _roofline_and_cost(spec, model, plan, workload_spec, speed)
    metrics = {**speed, **quality, **memory.details(), **figures}
    metrics["peak_memory_bytes"] = float(peak)
    metrics["peak_memory_gb"] = peak / 1e9
    metrics["warmup_s"] = phases.timings["warmup"]
    if ranks > 1:
        metrics["tp_ranks"] = float(ranks)  # the memory figures are rank 0's: one shard and its share of the work
    metrics |= energy_figures(joules, sum(len(row) for i in iterations for row in i.generated))
    details = TaskDetails(plan=plan.to_json() if plan != planned else None)  # what ran, when this installation differs
    return TaskResult(Outcome.OK, metrics=metrics, stats=stats, environment=environment(spec.device), details=details)


def refuse_what_cannot_run(config: dict[str, Any], plan: Plan) -> None:
    """UnsupportedError, with what to install or change, when this environment cannot run the configuration."""
    refused = rules.installation_problem(config, installed_version) or rules.plan_problem(plan)
    if refused is not None:
        raise UnsupportedError(refused.message, knob=refused.knob, combination=refused.knob is None)


def _quality(spec: TaskSpec, model: Any, generated: list[list[int]]) -> dict[str, float]:
    """Broken-output checks, teacher-forced KL / top-1 / perplexity, and greedy agreement."""
    reference_greedy = None
    if spec.greedy_reference_path:
        reference_greedy = json.loads(Path(spec.greedy_reference_path).read_text())["generated"][: len(generated)]
    reason = broken_reason(generated, reference_greedy)
    if reason:
        raise BrokenOutputError(reason)
    quality = compare_with_reference(model, load_reference(Path(spec.reference_path)))
    if reference_greedy is not None:
        quality["greedy_agreement"] = prefix_agreement(generated, reference_greedy)
    return quality


def _roofline_and_cost(spec: TaskSpec, model: Any, plan: Plan, workload: WorkloadSpec, speed: dict[str, float]) -> dict:
    weight_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    config = model.config.get_text_config(decoder=True)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element_bytes = 1 if plan.quantized_kv_cache else torch.finfo(model.dtype).bits // 8
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    kv = kv_bytes_per_token(config.num_hidden_layers, kv_heads, head_dim, element_bytes)
    requests = KINDS[workload.kind].requests(workload)
    per_step = decode_bytes_per_step(weight_bytes, kv, requests, workload.input_len, workload.output_len)
    figures = {"weight_bytes": float(weight_bytes), "decode_bytes_per_step": per_step}
    if spec.bandwidth_gb_s and speed["throughput_tok_s"] > 0:
        figures |= roofline(speed["throughput_tok_s"], requests, per_step, spec.bandwidth_gb_s)
    if spec.price_per_hour is not None and speed["e2e_throughput_tok_s"] > 0:
        price = spec.price_per_hour
        figures["cost_per_million_tokens_usd"] = cost_per_million_tokens(price, speed["e2e_throughput_tok_s"])
    return figures
