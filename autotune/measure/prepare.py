"""Before any trial: resolve (or build) the model and compute the reference outputs, in a worker."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune.errors import SearchError, UserError
from autotune.figures.constraints import Constraint
from autotune.figures.metrics import PEAK_MEMORY
from autotune.paths import demo_draft_path
from autotune.process.results import Candidate, Outcome, TaskResult, TaskSpec
from autotune.process.runner import Limits, run_in_worker
from autotune.profiles import HardwareProfile, ResolvedHardware
from autotune.space import Config, Plan, SearchSpace, Target, build_plan, rules
from autotune.space.knobs import AttentionKnob, DtypeKnob, WorkloadKnob, knob_defaults
from autotune.specs import ModelSpec, SearchRequest
from autotune.study import PreparedFacts
from autotune.traffic.shape import TrafficShape
from autotune.workloads import KINDS

MODEL_PHASES = ("resolve", "tokenizer")  # a failure there is the model argument's: bad input


@dataclass
class Prepared:
    """The resolved model, where trials run, and the reference outputs they are compared with."""

    model: ModelSpec
    model_info: dict[str, Any]
    environment: dict[str, Any]
    reference_config: Config
    reference_path: str
    greedy_reference_path: str
    reference_perplexity: float
    baseline_config: Config
    hardware: ResolvedHardware
    traffic: TrafficShape | None = None  # a trace's replayed requests, in the model's tokens

    def facts(self) -> PreparedFacts:
        return PreparedFacts(
            model_path=self.model.path,
            model_info=self.model_info,
            environment=self.environment,
            reference_config=self.reference_config,
            reference_perplexity=self.reference_perplexity,
            baseline_config=self.baseline_config,
            device=self.hardware.device,
            hardware_note=self.hardware.note,
            traffic=self.traffic,
        )


def prepare(
    request: SearchRequest,
    hardware: ResolvedHardware,
    space: SearchSpace,
    workdir: Path,
    deadline: float | None,
    reference: Config | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> Prepared:
    """Resolve the model and compute (or find cached) reference outputs on this machine.

    `reference` fixes the reference configuration (a worker joining a study uses the study's);
    otherwise the most precise configuration the profile can run, that fits in memory, is chosen.
    """
    if request.workload.traffic is not None:
        request.workload.traffic.keep(request.storage.cache_dir)  # the trace's requests, where trials read them
    spec = _prepare_task(request, hardware, space, reference)
    if on_phase is not None:
        on_phase("spawn")
    result = run_in_worker(
        spec, prepare_folder(workdir), Limits(request.budget.trial_timeout_s, deadline), on_phase=on_phase
    )
    if not result.ok:
        raise _prepare_error(request.model.id, result)
    details = result.details
    assert details.model_path and details.model is not None and details.reference is not None  # a prepare's
    model = spec.model
    model.path = details.model_path
    found, info = details.reference, details.model
    attention = info["default_attn_implementation"]
    baseline = baseline_config(space, info["checkpoint_dtype"], hardware.profile, request.workload.kind, attention)
    config = _with_defaults(space, found.config)
    return Prepared(
        model,
        info,
        result.environment,
        config,
        found.path,
        found.greedy_path,
        found.perplexity,
        baseline,
        hardware,
        details.traffic,
    )


def prepare_folder(workdir: Path) -> Path:
    """This process's folder for its prepare task's files. Workers on one study share the study's folder (several on
    one machine with --devices, or on several over a shared file system), and each prepares for itself: in one
    folder, the second to start deleted the first one's result before the first read it."""
    return workdir / f"prepare-{socket.gethostname()}-{os.getpid()}"


def _prepare_task(
    request: SearchRequest, hardware: ResolvedHardware, space: SearchSpace, reference: Config | None
) -> TaskSpec:
    """The prepare task: the model resolved, the reference configuration (the first candidate that runs) measured."""
    profile = hardware.profile
    configs = [reference] if reference else [_defaults(d, request.workload.kind) for d in _precise_dtypes(profile)]
    candidates = [_candidate(space, config, plan_target(profile, request)) for config in configs]
    return TaskSpec(
        "prepare",
        replace(request.model),  # a copy: the prepare task fills in its path
        hardware.device,
        str(request.storage.cache_dir),
        request.workload,
        request.quality,
        reference_candidates=candidates,
        memory_cap_bytes=profile.memory_bytes,
    )


def _prepare_error(model: str, result: TaskResult) -> Exception:
    if result.outcome == Outcome.BUDGET:
        return SearchError("the budget ran out while preparing the model and its reference; give a larger --budget")
    if result.phase == "context":  # the workload does not fit in the model's positions
        return UserError(result.message.partition(": ")[2])
    if result.phase in MODEL_PHASES and "trust_remote_code" in result.message:
        return UserError(
            f"model {model!r} comes with its own code, which autotune runs only with --trust-remote-code "
            "(read that code first: it runs with your permissions)"
        )
    if result.phase in MODEL_PHASES:
        first_line = result.message.splitlines()[0] if result.message else result.outcome.value
        local = model == "demo" or Path(model).expanduser().exists()
        hint = "check that folder" if local else "pass a local folder, or a hub id reachable from here"
        return UserError(f"cannot load model {model!r}: {first_line}; {hint}")
    return SearchError(f"preparing the reference failed ({result.outcome.value}): {result.message}")


def _precise_dtypes(profile: HardwareProfile) -> list[str]:
    return [dtype for dtype in DtypeKnob.by_precision if profile.why_not_value(DtypeKnob.name, dtype) is None]


def _defaults(dtype: str, workload: str) -> Config:
    """Every knob at its transformers default, left out by normalize() where the space lacks it.

    No attention: loaded without one, transformers picks what the architecture supports (sdpa for
    most, eager for those that refuse sdpa); the worker reports its pick.
    """
    return {DtypeKnob.name: dtype, **knob_defaults(), WorkloadKnob.name: workload}


def _with_defaults(space: SearchSpace, config: Config) -> Config:
    """`config` with the knobs that apply to it at their defaults where it has none (the attention the worker
    picked can make a knob apply), so that it is measured as it ran, not with sampled values."""
    full = {**knob_defaults(), **config}
    return space.including(full).normalize(full)


def expected_reference(space: SearchSpace, profile: HardwareProfile, workload: str, attention: str) -> Config:
    """The reference the prepare step picks when the most precise dtype fits in memory (its first candidate)."""
    return _with_defaults(space, {**_defaults(_precise_dtypes(profile)[0], workload), AttentionKnob.name: attention})


def plan_target(profile: HardwareProfile, request: SearchRequest, traffic: TrafficShape | None = None) -> Target:
    """What plans are built for: the profile's device type, the workload's shape (the requests its kind runs at once,
    the longest request of a trace once prepared), the draft model."""
    workload = request.workload
    return Target(
        profile.device_type,
        KINDS[workload.kind].requests(workload),
        traffic.max_tokens if traffic is not None else workload.input_len + workload.output_len,
        workload.kind,
        assistant_model=assistant_model(request),
        shared_prefixes=workload.traffic is not None and workload.traffic.shared,
    )


def runnable_space(declared: SearchSpace, profile: HardwareProfile, target: Target) -> SearchSpace:
    """What a search samples: the values the profile can run, whose packages are installed here, that the
    workload would not only see refused."""
    hardware = declared.prune(profile.why_not_value).prune(rules.why_not_installed)
    return hardware.prune(lambda knob, value: rules.workload_problem(knob, value, target))


def machine_notes(space: SearchSpace) -> list[str]:
    """One line per value left out for what this machine answered about it (rules.Host)."""
    return [
        f"not searched: {knob}={value}, {reason}"
        for knob, values in space.removed.items()
        for value, reason in values.items()
        if rules.left_out_for_this_machine(knob, value, reason)
    ]


def assistant_model(request: SearchRequest) -> str | None:
    """--assistant-model, or the demo's draft (built beside the demo model) for --model demo."""
    if request.model.assistant is not None or request.model.id != "demo":
        return request.model.assistant
    return str(demo_draft_path(request.storage.cache_dir))


def _candidate(space: SearchSpace, config: Config, target: Target) -> Candidate:
    normalized = space.including(config).normalize(config)
    return Candidate(normalized, build_plan(normalized, target))


def baseline_config(
    space: SearchSpace, checkpoint_dtype: str, profile: HardwareProfile, workload: str, attention: str = "sdpa"
) -> Config:
    """What from_pretrained + generate do with no arguments: the checkpoint's dtype, the attention
    transformers picks for the architecture (sdpa for most), dynamic cache."""
    dtypes = _precise_dtypes(profile)
    dtype = checkpoint_dtype if checkpoint_dtype in dtypes else dtypes[-1]
    defaults = {**_defaults(dtype, workload), AttentionKnob.name: attention}
    return space.including(defaults).normalize(defaults)


def memory_limit(profile_bytes: int | None, constraints: Iterable[Constraint]) -> float | None:
    """The most memory a trial may use: the profile's, or less where a --constraint on peak memory says so."""
    bounds = [c.bound * 1e9 for c in constraints if c.metric == PEAK_MEMORY.name and c.op in ("<=", "<")]
    limits = [*bounds, *([profile_bytes] if profile_bytes else [])]
    return min(limits) if limits else None


def trial_spec(request: SearchRequest, prepared: Prepared, config: Config, plan: Plan) -> TaskSpec:
    """What a worker needs to measure one configuration."""
    profile, price = prepared.hardware.profile, request.hardware.price_per_hour
    return TaskSpec(
        "trial",
        prepared.model,
        prepared.hardware.device,
        str(request.storage.cache_dir),
        request.workload,
        request.quality,
        candidate=Candidate(config, plan),
        reference_path=prepared.reference_path,
        greedy_reference_path=prepared.greedy_reference_path,
        memory_cap_bytes=profile.memory_bytes,
        memory_limit_bytes=memory_limit(profile.memory_bytes, request.constraints),
        bandwidth_gb_s=prepared.hardware.bandwidth_gb_s,
        price_per_hour=price if price is not None else profile.price_per_hour,
    )
