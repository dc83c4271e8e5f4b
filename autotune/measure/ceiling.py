"""`autotune ceiling`: the hand-written decode loop (autotune.worker.ceiling) measured in a worker process, as a trial
is, and its figures stored with a study where one is named (autotune.study.ceilings)."""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import optuna

from autotune.paths import default_cache_dir
from autotune.process.ceiling import Ceiling, CeilingSpec
from autotune.process.results import TaskResult, TaskSpec
from autotune.process.runner import Limits, run_in_worker
from autotune.profiles import resolve_hardware
from autotune.specs import ModelSpec
from autotune.study import load_stored_study
from autotune.study.ceilings import add_ceilings, check_same_device, check_same_model


@dataclass(frozen=True)
class CeilingRequest:
    model: str  # demo, a folder or a hub id
    device: str
    gpu: str  # the hardware profile whose peak bandwidth the roofline is of
    hand_loop: CeilingSpec
    study: str | None = None  # store the figures with this study
    storage_url: str | None = None


@dataclass(frozen=True)
class CeilingRun:
    figures: list[Ceiling]
    failure: TaskResult | None = None  # the worker's result, where it measured nothing


def measure_ceilings(request: CeilingRequest) -> CeilingRun:
    """The hand loop at each batch size, in a worker; with a study, refused before anything is measured unless the
    study searched this model on this device, and stored with it."""
    bandwidth = resolve_hardware(request.gpu, request.device).bandwidth_gb_s
    study, searched_on = _study_to_store_with(request)
    spec = TaskSpec(
        "ceiling", ModelSpec(request.model), request.device, str(default_cache_dir()), bandwidth_gb_s=bandwidth,
        ceiling=replace(request.hand_loop, study_device_name=searched_on),
    )  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="autotune-ceiling-"))
    try:
        result = run_in_worker(spec, workdir, Limits(timeout_s=math.inf))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if study is not None and searched_on is not None and "device_name" in result.environment:
        check_same_device(study, result.environment["device_name"], searched_on)
    if not result.ok:
        return CeilingRun([], result)
    figures = list(result.details.ceilings or [])
    if study is not None:
        add_ceilings(study, [asdict(figure) for figure in figures])
    return CeilingRun(figures)


def _study_to_store_with(request: CeilingRequest) -> tuple[optuna.Study | None, str | None]:
    """The study named, and the device it searched on; UserError unless it exists and searched this model."""
    if request.study is None:
        return None, None
    assert request.storage_url is not None
    study = load_stored_study(request.storage_url, request.study)
    return study, check_same_model(study, request.model)
