"""`autotune search --dry-run`: the trials a search would run first, in order, each with why.

Nothing runs and no study is created: the plan is the strategy's own (strategy/queue.py), made from
the profile's runnable space, the model's checkpoint dtype (read from its config.json where that can
be found without the network) and the knob handlers' priors, each planned trial taken to measure what
its forecast says. A real search changes course as soon as a trial measures something else.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import UserError
from autotune.figures.metrics import OBJECTIVES, Metric, objectives_named
from autotune.measure.prepare import (
    baseline_config,
    expected_reference,
    machine_notes,
    plan_target,
    runnable_space,
)
from autotune.paths import default_space_path
from autotune.profiles import PROFILES, HardwareProfile, resolve_hardware
from autotune.space import Config, SearchSpace, Target, build_plan, config_key, load_space, rules
from autotune.specs import SearchRequest
from autotune.strategy.durations import Durations
from autotune.strategy.forecast import Forecaster
from autotune.strategy.queue import Situation, next_queued, warm_up_set
from autotune.strategy.ranking import Planned
from autotune.workloads import KINDS

DEMO_CHECKPOINT_DTYPE = "bfloat16"  # worker/demo_model.py saves the demo's weights in bfloat16
ASSUMED_DTYPE = "bfloat16"  # most hub checkpoints
ASSUMED_ATTENTION = "sdpa"  # what transformers picks for most architectures
PLANNED_AT_MOST = 60  # a dry run without --trials lists this many trials at most


@dataclass(frozen=True)
class PlannedTrial:
    config: Config
    why: str
    relative_seconds: float  # expected duration against a plain trial (the baseline's kind)
    at_most: float | None  # the longest it may take, in plain trials, as the budget checks it; None: the first

    def to_json(self) -> dict:
        return {"config": self.config, "why": self.why}


@dataclass(frozen=True)
class DryRun:
    profile: HardwareProfile
    checkpoint: str  # the checkpoint dtype and where it was read, or that it was assumed
    baseline: Config
    trials: list[PlannedTrial]
    sampler_next: bool  # the strategy had nothing more to plan: the sampler takes over after these
    probe: str | None = None  # what each trial's capacity probe measures at most, and what that costs
    notes: tuple[str, ...] = ()  # values left out of the space for this machine, each with why

    def to_json(self) -> str:
        return json.dumps([trial.to_json() for trial in self.trials], indent=2)


def dry_run(request: SearchRequest) -> DryRun:
    """The first trials of a search with these flags, without a study and without running anything."""
    profile = _profile(request.hardware.gpu, request.hardware.device)
    target = plan_target(profile, request)
    space = runnable_space(load_space(request.space_path or default_space_path()), profile, target)
    dtype, checkpoint = checkpoint_dtype(request.model.id)
    workload = request.workload.kind
    reference = expected_reference(space, profile, workload, ASSUMED_ATTENTION)
    baseline = baseline_config(space, dtype, profile, workload, ASSUMED_ATTENTION)
    space = space.including(reference).including(baseline)
    situation = Situation(space, baseline, profile.device_type, _objectives(request), workload)
    limit = request.budget.max_trials or PLANNED_AT_MOST
    trials, more = _plan(situation, reference, _skip(space, target), limit)
    probe = KINDS[workload].describe_probe(request.workload)
    notes = tuple(machine_notes(space))
    return DryRun(profile, checkpoint, baseline, trials, sampler_next=not more, probe=probe, notes=notes)


def _profile(gpu: str, device: str | None) -> HardwareProfile:
    """The profile to plan for; a GPU profile needs no GPU here."""
    if gpu in PROFILES:
        return PROFILES[gpu]
    return resolve_hardware(gpu, device).profile  # auto: the card found here; else the unknown-profile error


def _objectives(request: SearchRequest) -> tuple[Metric, ...]:
    return objectives_named(request.objectives) if request.objectives else OBJECTIVES


def _skip(space: SearchSpace, target: Target) -> Callable[[Config], str | None]:
    def skip(config: Config) -> str | None:
        if space.violation(config):
            return space.violation(config)
        return rules.unmeasurable(build_plan(config, target))

    return skip


def _plan(
    situation: Situation, reference: Config, skip: Callable[[Config], str | None], limit: int
) -> tuple[list[PlannedTrial], bool]:
    """Walk the strategy as a search would, each trial measuring its forecast; whether more was planned."""
    baseline = situation.baseline
    anchors = [Planned(reference, "reference")]
    if config_key(reference) == config_key(baseline):
        anchors = [Planned(reference, "reference and baseline")]
    else:
        anchors.append(Planned(baseline, "baseline"))
    measured: dict[str, tuple[Config, dict]] = {}
    ended: list[tuple[Config, float]] = []
    trials: list[PlannedTrial] = []
    warm_up = warm_up_set(situation.space, baseline)
    queue = list(anchors)
    while len(trials) < limit:
        durations = Durations(ended, baseline, situation.device)
        planned = queue.pop(0) if queue else next_queued(situation, warm_up, measured, set(measured), skip, durations)
        if planned is None:
            return trials, False
        forecaster = Forecaster(
            situation.space, baseline, situation.device, measured, durations, situation.objectives, situation.changes
        )
        forecast = forecaster.forecast(planned.config)
        assert forecast is not None  # every change of a config has an expected effect
        measured[config_key(planned.config)] = (planned.config, forecast.figures)
        ended.append((planned.config, forecast.seconds))
        at_most = durations.of(planned.config).at_most
        trials.append(PlannedTrial(planned.config, planned.why, forecast.seconds, at_most))
    return trials, True


def checkpoint_dtype(model: str) -> tuple[str, str]:
    """The dtype the model's checkpoint declares and where that was read; assumed when it cannot be read here."""
    if model == "demo":
        return DEMO_CHECKPOINT_DTYPE, f"{DEMO_CHECKPOINT_DTYPE} (the demo model's)"
    folder = Path(model).expanduser()
    config = folder / "config.json" if folder.is_dir() else _cached_hub_config(model)
    if config is None or not config.is_file():
        if folder.exists() or model.startswith((".", "/")):
            raise UserError(f"model folder {model} has no readable config.json; pass a folder saved by save_pretrained")
        return ASSUMED_DTYPE, f"{ASSUMED_DTYPE} (assumed: {model}'s config.json is not in the local cache)"
    try:
        declared = json.loads(config.read_text())
    except (OSError, ValueError):
        return ASSUMED_DTYPE, f"{ASSUMED_DTYPE} (assumed: {config} is not readable JSON)"
    dtype = str(declared.get("dtype") or declared.get("torch_dtype") or "float32")  # transformers' own fallback
    return dtype, f"{dtype} (from {config})"


def _cached_hub_config(model: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json")
    except Exception:  # not a hub id, or no cache
        return None
    return Path(found) if isinstance(found, str) else None
