"""Measure one configuration, with no study: the same prepare and trial worker the search uses."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from autotune.errors import UserError
from autotune.measure.prepare import baseline_config, plan_target, prepare, trial_spec
from autotune.paths import default_space_path
from autotune.process.results import TaskResult
from autotune.process.runner import Limits, run_in_worker
from autotune.profiles import resolve_hardware
from autotune.space import KNOBS, Config, SearchSpace, build_plan, load_space, rules
from autotune.space.knobs import Value
from autotune.space.rules import why_not_installed
from autotune.specs import SearchRequest


def parse_overrides(pairs: list[str]) -> dict[str, Value]:
    """`--set knob=value` pairs -> knob values, each checked by its knob's handler."""
    overrides: dict[str, Value] = {}
    for pair in pairs:
        name, separator, text = pair.partition("=")
        if not separator or not name or not text:
            raise UserError(f"--set {pair!r} is not knob=value; e.g. --set dtype=bfloat16")
        if name not in KNOBS:
            raise UserError(f"--set {pair!r}: unknown knob {name!r}; known knobs: {', '.join(KNOBS)}")
        value: Value = int(text) if text.isdigit() else text
        if not KNOBS[name].accepts(value):
            raise UserError(f"--set {pair!r}: knob {name} takes {KNOBS[name].describe_values()}")
        overrides[name] = value
    return overrides


def measure(request: SearchRequest, overrides: dict[str, Value]) -> tuple[Config, TaskResult]:
    """Measure the baseline configuration with `overrides` applied; return it and the trial's result."""
    hardware = resolve_hardware(request.hardware.gpu, request.hardware.device)
    for name, value in overrides.items():
        reason = hardware.profile.why_not_value(name, value)
        if reason:
            raise UserError(f"{name}={value} is not measured on profile {hardware.profile.name}: {reason}")
        missing = why_not_installed(name, value)
        if missing:
            raise UserError(missing)
    space = load_space(request.space_path or default_space_path()).including(overrides)
    prompts_path = request.workload.prompts_path
    if prompts_path and not Path(prompts_path).is_file():
        raise UserError(f"prompts file {prompts_path} does not exist")
    workdir = Path(tempfile.mkdtemp(prefix="autotune-measure-"))
    try:
        prepared = prepare(request, hardware, space, workdir, deadline=None)
        info = prepared.model_info
        attention = info["default_attn_implementation"]
        baseline = baseline_config(space, info["checkpoint_dtype"], hardware.profile, "throughput", attention)
        config = _configuration(space.including(baseline), {**baseline, **overrides}, overrides)
        built = build_plan(config, plan_target(hardware.profile, request, prepared.traffic))
        if problem := rules.unmeasurable(built):
            raise UserError(f"{problem}; set other knobs")
        spec = trial_spec(request, prepared, config, built)
        result = run_in_worker(spec, workdir / "trial", Limits(request.budget.trial_timeout_s))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return config, result


def _configuration(space: SearchSpace, wanted: Config, overrides: dict[str, Value]) -> Config:
    """The configuration to measure; an override that would be ignored or that a rule forbids is bad input."""
    declared = space.knob_names()
    config = {**space.normalize(wanted), **{k: v for k, v in overrides.items() if k not in declared}}
    for name in overrides:
        if name in declared and name not in config:
            condition = " and ".join(f"{k} in {list(v)}" for k, v in space.knob(name).when.items())
            raise UserError(f"--set {name} applies only when {condition}; set those knobs too")
    reason = space.violation(config)
    if reason:
        raise UserError(f"this configuration is never run: {reason}")
    return config
