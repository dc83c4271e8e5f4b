"""The search: prepare the model and reference, then ask Optuna for configurations and measure them.

This process never imports torch; every model-touching step runs in a worker subprocess.
"""

from __future__ import annotations

import logging
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.storages import fail_stale_trials

from autotune import study as studies
from autotune.constraints import Constraint, parse_constraints
from autotune.errors import UserError
from autotune.profiles import GpuProfile, Hardware, resolve_hardware
from autotune.results import Candidate, ModelSpec, Outcome, QualitySpec, TaskResult, TaskSpec, WorkloadSpec
from autotune.runner import Limits, run_task
from autotune.space import Config, SearchSpace, Target, build_plan, config_key, load_space
from autotune.study import StudySettings, TrialRecord

log = logging.getLogger(__name__)

PACKAGED_SPACE = Path(__file__).parent / "spaces" / "default.yaml"
DEFAULT_SPACE = Path("search_spaces/default.yaml")
MAX_CONSECUTIVE_SKIPS = 50
HEARTBEAT_EVERY_S = 10.0

REFERENCE_DTYPES = ("float32", "bfloat16", "float16")  # most precise first
DEFAULTS = {
    "attn_implementation": "sdpa",
    "quantization": "none",
    "batching": "generate",
    "cache_implementation": "dynamic",
}


def default_cache_dir() -> Path:
    return Path(os.environ.get("AUTOTUNE_CACHE_DIR") or Path.home() / ".cache" / "autotune")


def default_space_path() -> Path:
    return DEFAULT_SPACE if DEFAULT_SPACE.exists() else PACKAGED_SPACE


@dataclass
class SearchOptions:
    model: str
    gpu: str = "auto"
    device: str | None = None
    budget_s: float | None = None
    max_trials: int | None = None
    space_path: Path | None = None
    study_name: str | None = None
    storage: str | None = None
    revision: str | None = None
    trust_remote_code: bool = False
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    quality: QualitySpec = field(default_factory=QualitySpec)
    trial_timeout_s: float = 1200.0
    cache_dir: Path = field(default_factory=default_cache_dir)
    studies_dir: Path = Path("studies")
    seed: int | None = None
    constraints: list[Constraint] = field(default_factory=list)  # passed to Optuna with trial.set_constraint


class SearchEvents(Protocol):
    def note(self, message: str) -> None: ...
    def trial_started(self, number: int, config: Config, roles: list[str]) -> None: ...
    def trial_finished(self, record: TrialRecord) -> None: ...


@dataclass
class SearchSummary:
    study_name: str
    storage: str
    launched: int
    stop_reason: str
    elapsed_s: float
    spent_s: dict[str, float]


class SearchError(Exception):
    """The search cannot go on (e.g. the reference configuration fails); exit status 1."""


# --------------------------------------------------------------------------------------- the search


def run_search(options: SearchOptions, events: SearchEvents) -> SearchSummary:
    started = time.monotonic()
    deadline = started + options.budget_s if options.budget_s else None
    session = _open_session(options, events)
    prepared = _prepare(options, session, deadline)
    study = session.attach(prepared)
    stored = sum(1 for record in studies.records(study) if record.launched and record.outcome)
    events.note(
        f"study {session.name} in {studies.redact(session.storage_url)}: profile {session.profile.name}, "
        f"{session.space.size()} configurations in the space, {stored} trials stored"
    )
    if session.settings.constraints:
        events.note(f"constraints: {', '.join(session.settings.constraints)} (feasible trials only on the front)")
    spent = {"prepare": time.monotonic() - started, "measuring": 0.0, "failed": 0.0}
    launched, stop_reason = 0, "trial limit reached"
    space = studies.space_with_exclusions(session.space, study)
    while True:
        stop = _should_stop(options, launched, study, deadline)
        if stop:
            stop_reason = stop
            break
        picked = _next_trial(study, space)
        if picked is None:
            stop_reason = "every configuration of the space has been measured"
            break
        trial, config, roles = picked
        events.trial_started(trial.number, config, roles)
        result, duration = _measure(session, study, trial, config, roles, prepared, deadline)
        spent["measuring" if result.ok else "failed"] += duration
        launched += 1
        if result.excludes:
            space = _exclude(study, session.space, result)
        events.trial_finished(TrialRecord.from_frozen(study.get_trials(deepcopy=False)[trial.number]))
        if result.outcome == Outcome.BUDGET:
            stop_reason = "budget used up"
            break
    elapsed = time.monotonic() - started
    summary = SearchSummary(session.name, session.storage_url, launched, stop_reason, elapsed, spent)
    studies.record_search_run(study, _run_record(options, summary))
    return summary


def _run_record(options: SearchOptions, summary: SearchSummary) -> dict[str, Any]:
    """What the report's "budget used" needs, stored with the study."""
    return {
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "budget_s": options.budget_s,
        "max_trials": options.max_trials,
        "launched": summary.launched,
        "elapsed_s": summary.elapsed_s,
        "spent_s": summary.spent_s,
        "stop_reason": summary.stop_reason,
    }


@dataclass
class _Session:
    """What the search knows before any trial: hardware, space, study name and storage."""

    options: SearchOptions
    hardware: Hardware
    declared: SearchSpace
    space: SearchSpace
    name: str
    storage_url: str
    storage: optuna.storages.RDBStorage | None
    existing: optuna.Study | None
    settings: StudySettings

    @property
    def constraints(self) -> list[Constraint]:
        return parse_constraints(self.settings.constraints)

    @property
    def profile(self) -> GpuProfile:
        return self.hardware.profile

    @property
    def workdir(self) -> Path:
        return self.options.studies_dir / self.name

    def attach(self, prepared: _Prepared) -> optuna.Study:
        """Create the study, or load it to resume; store what the report needs."""
        storage = self.storage or studies.open_storage(self.storage_url)
        if self.existing is None:
            self.space = self.space.including(prepared.reference_config).including(prepared.baseline_config)
            self.settings.space = self.space.to_json()
            study = studies.create_study(storage, self.name, self.settings, self.options.seed)
        else:
            study = studies.load_existing(storage, self.name, self.options.seed)
            self.space = SearchSpace.from_json(studies.stored_settings(study).space)
        self.storage = storage
        self.settings.extra.update(prepared.extra())
        self.settings.space = self.space.to_json()
        studies.update_settings(study, self.settings)
        fail_stale_trials(study)
        _enqueue_anchors(study, prepared)
        return study


def _open_session(options: SearchOptions, events: SearchEvents) -> _Session:
    """Check every input before anything is written: hardware, space, model path, existing study."""
    hardware = resolve_hardware(options.gpu, options.device)
    if hardware.note:
        events.note(hardware.note)
    declared = load_space(options.space_path or default_space_path())
    space = declared.prune(hardware.profile.why_not_value)
    _check_model_argument(options.model)
    name = options.study_name or studies.default_study_name(options.model, hardware.profile.name)
    url = options.storage or studies.default_storage(name, options.studies_dir)
    settings = StudySettings(
        model=options.model,
        revision=options.revision,
        profile=hardware.profile.to_json(),
        space_fingerprint=declared.fingerprint(),
        space=space.to_json(),
        workload=options.workload.__dict__,
        quality=options.quality.__dict__,
        constraints=[str(constraint) for constraint in options.constraints],
    )
    storage, existing = None, None
    if not studies.sqlite_file_missing(url):
        storage = studies.open_storage(url)
        existing = studies.find_study(storage, name)
        if existing is not None:
            stored = studies.stored_settings(existing)
            settings.check_resumable(stored, name)
            settings.constraints = settings.constraints or stored.constraints  # none given: keep the study's
    return _Session(options, hardware, declared, space, name, url, storage, existing, settings)


def _check_model_argument(model: str) -> None:
    looks_local = model.startswith(("/", "./", "../", "~")) or Path(model).exists()
    if looks_local:
        path = Path(model).expanduser()
        if not path.is_dir():
            raise UserError(f"model path {model} does not exist or is not a directory; pass a hub id or a local folder")
        if not os.access(path, os.R_OK) or not (path / "config.json").is_file():
            raise UserError(f"model folder {model} has no readable config.json; pass a folder saved by save_pretrained")


# ---------------------------------------------------------------------------------------- preparing


@dataclass
class _Prepared:
    model: ModelSpec
    model_info: dict[str, Any]
    environment: dict[str, Any]
    reference_config: Config
    reference_path: str
    reference_perplexity: float
    baseline_config: Config
    hardware: Hardware

    def extra(self) -> dict[str, Any]:
        return {
            "model_info": self.model_info,
            "model_path": self.model.path,
            "environment": self.environment,
            "reference": {"config": self.reference_config, "perplexity": self.reference_perplexity},
            "baseline": {"config": self.baseline_config},
            "device": self.hardware.device,
            "hardware_note": self.hardware.note,
        }


def _prepare(options: SearchOptions, session: _Session, deadline: float | None) -> _Prepared:
    """Resolve (or build) the model and compute the reference outputs, in a worker process."""
    profile, space = session.profile, session.space
    candidates = [_candidate(space, _defaults(dtype), profile) for dtype in _precise_dtypes(profile)]
    model = ModelSpec(options.model, revision=options.revision, trust_remote_code=options.trust_remote_code)
    spec = TaskSpec(
        "prepare",
        model,
        session.hardware.device,
        str(options.cache_dir),
        options.workload,
        options.quality,
        reference_candidates=candidates,
        memory_cap_bytes=profile.memory_bytes,
    )
    result = run_task(spec, session.workdir / "prepare", Limits(options.trial_timeout_s, deadline))
    if not result.ok:
        raise _prepare_error(options.model, result)
    details = result.details
    model.path = details["model_path"]
    reference = details["reference"]
    baseline = _baseline_config(space, details["model"]["checkpoint_dtype"], profile)
    return _Prepared(
        model,
        details["model"],
        result.environment,
        reference["config"],
        reference["path"],
        reference["perplexity"],
        baseline,
        session.hardware,
    )


def _prepare_error(model: str, result: TaskResult) -> Exception:
    if result.phase == "resolve":
        first_line = result.message.splitlines()[0] if result.message else result.outcome.value
        return UserError(
            f"cannot load model {model!r}: {first_line}; pass a local folder, or a hub id reachable from here"
        )
    return SearchError(f"preparing the reference failed ({result.outcome.value}): {result.message}")


def _precise_dtypes(profile: GpuProfile) -> list[str]:
    return [dtype for dtype in REFERENCE_DTYPES if profile.why_not_value("dtype", dtype) is None]


def _defaults(dtype: str) -> Config:
    return {"dtype": dtype, **DEFAULTS}


def _candidate(space: SearchSpace, config: Config, profile: GpuProfile) -> Candidate:
    normalized = space.including(config).normalize(config)
    plan = build_plan(normalized, Target(profile.device_type))
    return Candidate(normalized, plan.to_json())


def _baseline_config(space: SearchSpace, checkpoint_dtype: str, profile: GpuProfile) -> Config:
    """What from_pretrained + generate do with no arguments: the checkpoint's dtype, sdpa, dynamic cache."""
    dtypes = _precise_dtypes(profile)
    dtype = checkpoint_dtype if checkpoint_dtype in dtypes else dtypes[-1]
    return space.including(_defaults(dtype)).normalize(_defaults(dtype))


def _enqueue_anchors(study: optuna.Study, prepared: _Prepared) -> None:
    """The reference and the baseline are measured first, so every report can compare with them."""
    reference, baseline = prepared.reference_config, prepared.baseline_config
    anchors = [(reference, ["reference"])]
    if config_key(baseline) == config_key(reference):
        anchors = [(reference, ["reference", "baseline"])]
    else:
        anchors.append((baseline, ["baseline"]))
    seen = studies.measured_keys(study)
    for config, roles in anchors:
        if config_key(config) not in seen:
            study.enqueue_trial(config, user_attrs={"roles": roles}, skip_if_exists=True)


# ------------------------------------------------------------------------------------------- trials


def _should_stop(options: SearchOptions, launched: int, study: optuna.Study, deadline: float | None) -> str | None:
    if options.max_trials is not None and launched >= options.max_trials:
        return f"{launched} trials run (--trials {options.max_trials})"
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        return "budget used up"
    expected = _expected_trial_s(study)
    if expected is not None and expected > left:
        return f"budget nearly used up: a trial takes about {expected:.0f}s and {left:.0f}s are left"
    return None


def _expected_trial_s(study: optuna.Study) -> float | None:
    durations = [
        trial.user_attrs["duration_s"]
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if "duration_s" in trial.user_attrs
    ]
    return statistics.median(durations) if durations else None


def _next_trial(study: optuna.Study, space: SearchSpace) -> tuple[optuna.Trial, Config, list[str]] | None:
    """Ask Optuna for a configuration that may run and was not measured; None when none is left."""
    seen = studies.measured_keys(study)
    for _ in range(MAX_CONSECUTIVE_SKIPS):
        trial = study.ask()
        config = space.suggest(trial)
        reason = space.violation(config)
        if reason is None and config_key(config) in seen:
            reason = f"same configuration as trial #{seen[config_key(config)]}"
        if reason is None:
            return trial, config, list(trial.user_attrs.get("roles", ["search"]))
        studies.record_skip(study, trial, config, reason)
    untried = [config for config in space.configurations() if config_key(config) not in seen]
    if not untried:
        return None
    # The sampler keeps proposing known or forbidden configurations: take an untried one at random.
    study.enqueue_trial(random.choice(untried), user_attrs={"roles": ["search"]})
    trial = study.ask()
    return trial, space.suggest(trial), ["search"]


def _measure(
    session: _Session,
    study: optuna.Study,
    trial: optuna.Trial,
    config: Config,
    roles: list[str],
    prepared: _Prepared,
    deadline: float | None,
) -> tuple[TaskResult, float]:
    options = session.options
    plan = build_plan(config, Target(session.profile.device_type)).to_json()
    studies.record_launch(trial, config, plan, roles)
    spec = TaskSpec(
        "trial",
        prepared.model,
        session.hardware.device,
        str(options.cache_dir),
        options.workload,
        options.quality,
        candidate=Candidate(config, plan),
        reference_path=prepared.reference_path,
        memory_cap_bytes=session.profile.memory_bytes,
    )
    heartbeat = _throttled(lambda: session.storage.record_heartbeat(trial._trial_id), HEARTBEAT_EVERY_S)
    started = time.monotonic()
    workdir = session.workdir / f"trial-{trial.number:04d}"
    result = run_task(spec, workdir, Limits(options.trial_timeout_s, deadline), on_tick=heartbeat)
    duration = time.monotonic() - started
    studies.record_result(study, trial, result, duration, session.constraints)
    return result, duration


def _exclude(study: optuna.Study, space: SearchSpace, result: TaskResult) -> SearchSpace:
    assert result.excludes is not None
    knob, value = result.excludes["knob"], result.excludes["value"]
    studies.add_exclusion(study, knob, value, f"{knob}={value} cannot run here: {result.message.splitlines()[0]}")
    return studies.space_with_exclusions(space, study)


def _throttled(action: Callable[[], None], every_s: float) -> Callable[[], None]:
    last = [0.0]

    def tick() -> None:
        now = time.monotonic()
        if now - last[0] >= every_s:
            last[0] = now
            action()

    return tick
