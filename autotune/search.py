"""The search: prepare the model and reference, then ask Optuna for configurations and measure them.

This process never imports torch; every model-touching step runs in a worker subprocess.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState

from autotune import study as studies
from autotune.claims import Claims
from autotune.constraints import Constraint, parse_constraints
from autotune.errors import UserError
from autotune.paths import default_cache_dir, default_space_path
from autotune.profiles import GpuProfile, Hardware, resolve_hardware
from autotune.recovery import OWNER_ATTR, recover_interrupted, this_process
from autotune.results import Candidate, ModelSpec, Outcome, QualitySpec, TaskResult, TaskSpec, WorkloadSpec
from autotune.runner import Limits, run_task
from autotune.space import Config, SearchSpace, Target, build_plan, config_key, load_space
from autotune.study import StudySettings, TrialRecord

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_SKIPS = 50
HEARTBEAT_EVERY_S = 10.0

REFERENCE_DTYPES = ("float32", "bfloat16", "float16")  # most precise first
DEFAULTS = {
    "attn_implementation": "sdpa",
    "quantization": "none",
    "batching": "generate",
    "cache_implementation": "dynamic",
}


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
    price_per_hour: float | None = None  # overrides the profile's price
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
    """Prepare, then measure configurations until the trial limit, the budget or the space runs out."""
    started = time.monotonic()
    deadline = started + options.budget_s if options.budget_s else None
    session = _open_session(options, events)
    try:
        prepared = prepare(options, session.hardware, session.space, session.workdir, deadline)
    except UserError:
        if session.existing is None:  # bad input leaves nothing behind
            shutil.rmtree(session.workdir, ignore_errors=True)
        raise
    search = _Search(session, session.attach(prepared, events), prepared, deadline, events)
    search.spending.add("preparing", time.monotonic() - started)
    stop_reason = search.run()
    elapsed = time.monotonic() - started
    search.spending.add("overhead", elapsed - sum(search.spending.seconds.values()))
    summary = SearchSummary(
        session.name, session.storage_url, search.launched, stop_reason, elapsed, search.spending.seconds
    )
    studies.record_search_run(search.study, _run_record(options, summary))
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
class Spending:
    """Where the wall-clock time of a search went."""

    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, category: str, duration: float) -> None:
        self.seconds[category] = self.seconds.get(category, 0.0) + duration

    def add_trial(self, result: TaskResult, duration: float) -> None:
        if result.ok:
            compiling = min(duration, result.metrics.get("compile_s", 0.0))
            self.add("compiling", compiling)
            self.add("measuring", duration - compiling)
        elif result.outcome == Outcome.BUDGET:
            self.add("stopped at the deadline", duration)
        else:
            self.add("failed trials", duration)


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
    claims: Claims | None = None

    @property
    def constraints(self) -> list[Constraint]:
        return parse_constraints(self.settings.constraints)

    @property
    def profile(self) -> GpuProfile:
        return self.hardware.profile

    @property
    def workdir(self) -> Path:
        return self.options.studies_dir / self.name

    def attach(self, prepared: Prepared, events: SearchEvents) -> optuna.Study:
        """Create the study, or load it to resume; store what the report needs; recover interrupted trials."""
        storage = self.storage or studies.open_storage(self.storage_url)
        if self.existing is None:
            self.space = self.space.including(prepared.reference_config).including(prepared.baseline_config)
            self.settings.space = self.space.to_json()
            study = studies.create_study(storage, self.name, self.settings, self.options.seed)
            if study is None:  # another search created it meanwhile: join it, as a resume would
                self.existing = studies.load_existing(storage, self.name, self.options.seed)
                self.settings.check_resumable(studies.wait_for_settings(self.existing), self.name)
        if self.existing is not None:
            study = studies.load_existing(storage, self.name, self.options.seed)
            self.space = SearchSpace.from_json(studies.stored_settings(study).space)
        self.storage = storage
        self.settings.extra.update(prepared.extra())
        self.settings.space = self.space.to_json()
        studies.update_settings(study, self.settings)
        self.claims = Claims(storage.engine, storage.get_study_id_from_name(self.name))
        recovered = recover_interrupted(study, self.claims)
        if recovered:
            numbers = ", ".join(f"#{number}" for number in recovered)
            events.note(f"trials {numbers} were interrupted when their process died; each is retried once")
        _enqueue_anchors(study, prepared)
        stored = sum(1 for record in studies.records(study) if record.launched and record.outcome)
        events.note(
            f"study {self.name} in {studies.redact(self.storage_url)}: profile {self.profile.name}, "
            f"{self.space.size()} configurations in the space, {stored} trials stored"
        )
        if self.settings.constraints:
            events.note(f"constraints: {', '.join(self.settings.constraints)} (feasible trials only on the front)")
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


def prepare(
    options: SearchOptions, hardware: Hardware, space: SearchSpace, workdir: Path, deadline: float | None
) -> Prepared:
    """Resolve (or build) the model and compute the reference outputs, in a worker process."""
    profile = hardware.profile
    defaults = [_defaults(dtype, options.workload.kind) for dtype in _precise_dtypes(profile)]
    candidates = [_candidate(space, config, profile) for config in defaults]
    model = ModelSpec(options.model, revision=options.revision, trust_remote_code=options.trust_remote_code)
    spec = TaskSpec(
        "prepare",
        model,
        hardware.device,
        str(options.cache_dir),
        options.workload,
        options.quality,
        reference_candidates=candidates,
        memory_cap_bytes=profile.memory_bytes,
    )
    result = run_task(spec, workdir / "prepare", Limits(options.trial_timeout_s, deadline))
    if not result.ok:
        raise _prepare_error(options.model, result)
    details = result.details
    model.path = details["model_path"]
    reference = details["reference"]
    baseline = baseline_config(space, details["model"]["checkpoint_dtype"], profile, options.workload.kind)
    return Prepared(
        model,
        details["model"],
        result.environment,
        reference["config"],
        reference["path"],
        reference["greedy_path"],
        reference["perplexity"],
        baseline,
        hardware,
    )


def _prepare_error(model: str, result: TaskResult) -> Exception:
    if result.outcome == Outcome.BUDGET:
        return SearchError("the budget ran out while preparing the model and its reference; give a larger --budget")
    if result.phase == "resolve" and "trust_remote_code" in result.message:
        return UserError(
            f"model {model!r} comes with its own code, which autotune runs only with --trust-remote-code "
            "(read that code first: it runs with your permissions)"
        )
    if result.phase == "resolve":
        first_line = result.message.splitlines()[0] if result.message else result.outcome.value
        local = model == "demo" or Path(model).expanduser().exists()
        hint = "check that folder" if local else "pass a local folder, or a hub id reachable from here"
        return UserError(f"cannot load model {model!r}: {first_line}; {hint}")
    return SearchError(f"preparing the reference failed ({result.outcome.value}): {result.message}")


def _precise_dtypes(profile: GpuProfile) -> list[str]:
    return [dtype for dtype in REFERENCE_DTYPES if profile.why_not_value("dtype", dtype) is None]


def _defaults(dtype: str, workload: str) -> Config:
    return {"dtype": dtype, **DEFAULTS, "workload": workload}


def _candidate(space: SearchSpace, config: Config, profile: GpuProfile) -> Candidate:
    normalized = space.including(config).normalize(config)
    plan = build_plan(normalized, Target(profile.device_type))
    return Candidate(normalized, plan.to_json())


def baseline_config(space: SearchSpace, checkpoint_dtype: str, profile: GpuProfile, workload: str) -> Config:
    """What from_pretrained + generate do with no arguments: the checkpoint's dtype, sdpa, dynamic cache."""
    dtypes = _precise_dtypes(profile)
    defaults = _defaults(checkpoint_dtype if checkpoint_dtype in dtypes else dtypes[-1], workload)
    return space.including(defaults).normalize(defaults)


def trial_spec(options: SearchOptions, prepared: Prepared, config: Config, plan: dict[str, Any]) -> TaskSpec:
    """What a worker needs to measure one configuration."""
    profile = prepared.hardware.profile
    return TaskSpec(
        "trial",
        prepared.model,
        prepared.hardware.device,
        str(options.cache_dir),
        options.workload,
        options.quality,
        candidate=Candidate(config, plan),
        reference_path=prepared.reference_path,
        greedy_reference_path=prepared.greedy_reference_path,
        memory_cap_bytes=profile.memory_bytes,
        bandwidth_gb_s=profile.bandwidth_gb_s,
        price_per_hour=options.price_per_hour if options.price_per_hour is not None else profile.price_per_hour,
    )


def _enqueue_anchors(study: optuna.Study, prepared: Prepared) -> None:
    """The reference and the baseline are measured first, so every report can compare with them."""
    reference, baseline = prepared.reference_config, prepared.baseline_config
    anchors = [(reference, ["reference"])]
    if config_key(baseline) == config_key(reference):
        anchors = [(reference, ["reference", "baseline"])]
    else:
        anchors.append((baseline, ["baseline"]))
    seen = studies.measured_keys(study)
    waiting = {config_key(t.params) for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))}
    for config, roles in anchors:
        # Not Optuna's skip_if_exists: an anchor stopped by the budget or interrupted must run again.
        if config_key(config) not in seen and config_key(config) not in waiting:
            study.enqueue_trial(config, user_attrs={"roles": roles})


# ------------------------------------------------------------------------------------------- trials


class _Search:
    """The loop: ask for a configuration, claim it, measure it in a worker, tell the result."""

    def __init__(
        self, session: _Session, study: optuna.Study, prepared: Prepared, deadline: float | None, events: SearchEvents
    ) -> None:
        self.session = session
        self.options = session.options
        self.study = study
        self.prepared = prepared
        self.deadline = deadline
        self.events = events
        self.claims = session.claims
        self.space = studies.space_with_exclusions(session.space, study)
        self.spending = Spending()
        self.launched = 0

    def run(self) -> str:
        """Measure trials until something stops the search; say what did."""
        while True:
            stop = self._limit_reached()
            if stop:
                return stop
            picked = self._next_trial()
            if picked is None:
                return "every configuration of the space has been measured"
            trial, config, roles = picked
            overrun = self._would_overrun(config)
            if overrun:
                self._release(config, trial.number)
                studies.record_skip(self.study, trial, config, overrun)
                return overrun
            result = self._measure(trial, config, roles)
            if result.outcome == Outcome.BUDGET:
                return "budget used up"

    def _limit_reached(self) -> str | None:
        if self.options.max_trials is not None and self.launched >= self.options.max_trials:
            return f"{self.launched} trials run (--trials {self.options.max_trials})"
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "budget used up"
        return None

    def _would_overrun(self, config: Config) -> str | None:
        """Why this trial must not start: its expected duration (from earlier trials) exceeds the budget left."""
        if self.deadline is None:
            return None
        return overrun_reason(config, studies.records(self.study), self.deadline - time.monotonic())

    def _next_trial(self) -> tuple[optuna.Trial, Config, list[str]] | None:
        """Ask Optuna for a configuration that may run and that no trial has claimed; None when none is left."""
        for _ in range(MAX_CONSECUTIVE_SKIPS):
            trial = self._ask()
            config = self.space.suggest(trial)
            reason = self.space.violation(config) or self._claim(config, trial.number)
            if reason is None:
                return trial, config, self._roles(trial)
            studies.record_skip(self.study, trial, config, reason)
        seen = studies.measured_keys(self.study)
        untried = [config for config in self.space.configurations() if config_key(config) not in seen]
        if not untried:
            return None
        # The sampler keeps proposing known or forbidden configurations: take an untried one at random.
        self.study.enqueue_trial(random.choice(untried), user_attrs={"roles": ["search"]})
        trial = self._ask()
        config = self.space.suggest(trial)
        reason = self._claim(config, trial.number)
        if reason is not None:  # another process took it meanwhile
            studies.record_skip(self.study, trial, config, reason)
            return self._next_trial()
        return trial, config, ["search"]

    def _ask(self) -> optuna.Trial:
        """A new trial, marked as ours with a first heartbeat at once, so a crash can never leave it RUNNING."""
        trial = self.study.ask()
        trial.set_user_attr(OWNER_ATTR, this_process())
        self.session.storage.record_heartbeat(trial._trial_id)  # Optuna's Trial has no public id accessor
        return trial

    def _roles(self, trial: optuna.Trial) -> list[str]:
        roles = list(trial.user_attrs.get("roles", ["search"]))
        frozen = self.study.get_trials(deepcopy=False)[trial.number]  # Trial does not show its system attributes
        if "failed_trial" in frozen.system_attrs and "retry" not in roles:
            roles.append("retry")
        return roles

    def _claim(self, config: Config, number: int) -> str | None:
        holder = self.claims.claim(config_key(config), number)
        return None if holder == number else f"same configuration as trial #{holder}"

    def _release(self, config: Config, number: int) -> None:
        self.claims.release(config_key(config), number)

    def _measure(self, trial: optuna.Trial, config: Config, roles: list[str]) -> TaskResult:
        self.events.trial_started(trial.number, config, roles)
        plan = build_plan(config, Target(self.session.profile.device_type)).to_json()
        studies.record_launch(trial, config, plan, roles)
        spec = trial_spec(self.options, self.prepared, config, plan)
        if (fault := _injected_fault(self.launched)) is not None:
            spec.fault = fault
        storage = self.session.storage
        heartbeat = _throttled(lambda: storage.record_heartbeat(trial._trial_id), HEARTBEAT_EVERY_S)
        workdir = self.session.workdir / f"trial-{trial.number:04d}"
        started = time.monotonic()
        limits = Limits(self.options.trial_timeout_s, self.deadline)
        on_start = lambda pid: trial.set_user_attr("worker_pid", pid)  # noqa: E731 - which process measures it
        result = run_task(spec, workdir, limits, on_tick=heartbeat, on_start=on_start)
        duration = time.monotonic() - started
        studies.record_result(self.study, trial, result, duration, self.session.constraints)
        if result.outcome == Outcome.BUDGET:
            self._release(config, trial.number)  # never measured: a later run may take it
        if result.excludes:
            self.space = _exclude(self.study, self.session.space, result)
        self.spending.add_trial(result, duration)
        self.launched += 1
        self.events.trial_finished(TrialRecord.from_frozen(self.study.get_trials(deepcopy=False)[trial.number]))
        return result


def overrun_reason(config: Config, history: list[TrialRecord], seconds_left: float) -> str | None:
    """Why a trial of this configuration must not start with this much budget left, or None."""
    expected = expected_duration_s(config, history)
    if expected is not None and expected > seconds_left:
        return f"budget nearly used up: a trial like this takes about {expected:.0f}s and {seconds_left:.0f}s are left"
    return None


def expected_duration_s(config: Config, history: list[TrialRecord]) -> float | None:
    """Median duration of finished trials that compile and batch as this one does, else of all of them."""
    finished = [r for r in history if r.duration_s is not None and r.outcome not in (None, Outcome.BUDGET)]

    def kind(values: Config) -> tuple:
        return values.get("compile", "off") != "off", values.get("batching"), values.get("quantization")

    alike = [r.duration_s for r in finished if kind(r.config) == kind(config)]
    durations = alike or [r.duration_s for r in finished]
    return statistics.median(durations) if durations else None


def _injected_fault(launch_index: int) -> dict[str, str] | None:
    """Tests make the n-th trial of a run (from 0) fail for real.

    AUTOTUNE_INJECT_FAULTS='{"3": {"phase": "load", "kind": "hang"}}' makes the fourth trial hang while loading.
    """
    faults = os.environ.get("AUTOTUNE_INJECT_FAULTS")
    return json.loads(faults).get(str(launch_index)) if faults else None


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
