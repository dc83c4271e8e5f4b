"""Older stored forms, read as today's: every patch a reader of a stored study needs, in one place.

Each function takes what a study or one of its trials stored and returns today's form, so that the rest of autotune
reads one form only; what today's code writes passes through unchanged. Studies written by main 8b80113 are kept as
a test fixture (tests/fixtures/studies_8b80113) and open with the figures they showed then.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.figures.capacity import Point, stop_of
from autotune.figures.metrics import OBJECTIVES
from autotune.figures.quality import stored_path
from autotune.profiles import STORED_DEVICE_TYPE
from autotune.space.knobs import DeviceType
from autotune.space.knobs.decoding import DecodeLoopKnob
from autotune.space.plan import Call, encode
from autotune.specs import QualitySpec
from autotune.workloads import workload_as_run

UNNAMED_DEVICE_TYPE: DeviceType = "cuda"  # profiles stored before they named their device type were all GPU profiles


def workload(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A study's workload as its trials ran: the serve load's SLO, stored inside the load before the SLO was every
    kind's, lifted out; what a kind decides itself, which studies and results written before the spec said so kept
    at its default (a latency workload's batch size, 8, though it ran one prompt at a time), as the kind decides it."""
    data = dict(stored)
    if isinstance(data.get("serve"), Mapping) and "slo" in data["serve"]:
        serve = dict(data["serve"])
        data["slo"] = data.get("slo") or serve.pop("slo") or {}
        serve.pop("slo", None)
        data["serve"] = serve
    return workload_as_run(data)


def profile(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A study's hardware profile (autotune.profiles.HardwareProfile.to_json) with its device type (cuda, cpu): a
    profile stored without one is a GPU's."""
    return {**stored, STORED_DEVICE_TYPE: stored.get(STORED_DEVICE_TYPE) or UNNAMED_DEVICE_TYPE}


PREFILL_QUALITY_KEY = "window"  # studies before the decoding path stored the window of their one forward pass


def quality(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A study's quality settings (autotune.specs.QualitySpec): studies written before the decoding path (2026-11-27)
    kept a window and a number of tokens of one forward pass, which are not the spec's and are dropped."""
    return {name: value for name, value in stored.items() if name in QualitySpec.__dataclass_fields__}


def quality_on_prefill(stored: Mapping[str, Any]) -> bool:
    """Whether a study's quality settings are those of the prefill path: a study written before 2026-11-27."""
    return PREFILL_QUALITY_KEY in stored


def objectives(stored: list[str] | None) -> list[str]:
    """The metrics a study optimises: studies stored before they were named have the default three."""
    return list(stored or [metric.name for metric in OBJECTIVES])


def capacity(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's capacity in today's form (autotune.figures.capacity.Capacity.to_json): capacities stored before
    it carried what the probe found as a sentence ("said", dropped: the words are made when it is shown) and no stop,
    which their points say; the first named no unit (a batch)."""
    data = {key: value for key, value in stored.items() if key != "said"}
    data["unit"] = data.get("unit") or "batch"
    if "stopped" not in data:
        stop = stop_of(sorted((Point.from_json(point) for point in data.get("points", [])), key=lambda p: p.size))
        data["stopped"] = stop.to_json() if stop else None
    return data


def plan(stored: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A trial's plan (autotune.space.plan.Plan.to_json) with its contexts and its worker hooks: plans stored before
    contexts were general said `execution_mode` (inference_mode: generate() inside torch.inference_mode()), or nothing
    before that knob; plans stored before a hook carried its value (main 5bb2cda and before) named its module alone,
    and a decoding loop as a `decode_loop` of the plan's own."""
    if stored is None:
        return None
    data = dict(stored)
    if "contexts" not in data:
        contexts = [Call("torch.inference_mode")] if data.get("execution_mode") == "inference_mode" else []
        data["contexts"] = encode(contexts)
    hooks = {
        knob: {"module": hook, "value": None} if isinstance(hook, str) else hook
        for knob, hook in data.get("worker_hooks", {}).items()
    }
    if (loop := data.pop("decode_loop", None)) is not None:
        hooks[DecodeLoopKnob.name] = {"module": DecodeLoopKnob.worker_hook, "value": loop}
    if hooks:
        data["worker_hooks"] = hooks
    return data


def kept_result(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A result kept on disk until the storage has it (autotune.process.results.TaskResult.to_json, study/kept.py), as
    today's: results kept before the blame was one type (main f92f638 and before) said the value a failure points at
    as `excludes` (a typed refusal) or `suspects` (the error's words); the plan the worker ran, as a trial's plan."""
    data = dict(stored)
    excludes, suspects = data.pop("excludes", None), data.pop("suspects", None)
    if data.get("blame") is None and (excludes or suspects):
        data["blame"] = {**(excludes or suspects), "certain": bool(excludes)}
    details = dict(data.get("details") or {})
    if details.get("plan") is not None:
        data["details"] = details | {"plan": plan(details["plan"])}
    return data


def quality_path(stored: str | None) -> str:
    """Where a trial's quality figures came from: a trial that names no path was measured on the prefill path."""
    return stored_path(stored)


def trial_config(stored: Mapping[str, Any] | None, params: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's configuration: as autotune stored it, else Optuna's parameters (a trial autotune did not launch)."""
    return dict(stored) if stored else dict(params)
