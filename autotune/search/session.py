"""The study a search works on: every input checked before anything is written, then the study created or joined.

`check_search` (a search) and `check_worker` (a worker joining a study) check the inputs and write nothing;
once the model is prepared, `open_session` creates or loads the study and makes the Session, whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune import for_tests
from autotune import study as studies
from autotune.errors import UserError
from autotune.figures.constraints import Constraint, parse_constraints
from autotune.figures.objectives import ENERGY, check_available
from autotune.measure.prepare import Prepared, plan_target, runnable_space
from autotune.paths import default_space_path
from autotune.profiles import HardwareProfile, ResolvedHardware, hardware_for, has_energy_counter, resolve_hardware
from autotune.search import interrupts
from autotune.search.events import SearchEvents
from autotune.space import Config, SearchSpace, config_key, load_space, rules
from autotune.specs import HardwareSpec, ModelSpec, SearchRequest, WorkerRequest
from autotune.study import StudySettings, artifacts
from autotune.study.claims import Claims
from autotune.study.compile_archives import CompileArchives
from autotune.study.patience import PatientStorage
from autotune.study.records import front_numbers
from autotune.study.recovery import LogAttacher, Recovery
from autotune.study.traffic import fetch_window, store_window
from autotune.workloads import KINDS, metrics_of_one_kind


@dataclass(frozen=True)
class Checked:
    """A search's inputs, each checked before anything is written: hardware, space, study name and storage, the
    settings the study is bound to, and the study itself where it exists already."""

    request: SearchRequest
    hardware: ResolvedHardware
    space: SearchSpace
    name: str
    storage_url: str
    patient_storage: PatientStorage | None  # None: its SQLite file does not exist yet
    existing: optuna.Study | None
    settings: StudySettings
    joining: bool = False  # a worker joining a study: it leaves the study's settings as they are

    @property
    def profile(self) -> HardwareProfile:
        return self.hardware.profile

    @property
    def workdir(self) -> Path:
        return studies.trial_folder(self.storage_url, self.name, self.request.storage.cache_dir)

    @contextmanager
    def named_on_interrupt(self) -> Iterator[None]:
        """An interrupt that passes through here learns which study to report on: what it keeps, and that the same
        command resumes."""
        try:
            yield
        except interrupts.Interrupted as interrupt:
            interrupt.study = interrupts.StudyPlace(self.name, self.storage_url)
            raise


@dataclass(frozen=True)
class Session:
    """A search's study, whole from the start: made by `open_session` from the checked inputs and the prepared model."""

    request: SearchRequest
    hardware: ResolvedHardware
    space: SearchSpace  # as the study stores it
    name: str
    storage_url: str
    patient_storage: PatientStorage
    study: optuna.Study
    settings: StudySettings
    prepared: Prepared
    claims: Claims
    artifact_store: Any  # trial logs go there (autotune.study.artifacts), None where there is none
    recovery: Recovery  # between trials: kept results stored, the trials of dead processes failed and retried
    compile_archives: CompileArchives  # the study's compiled code: where trials compile here, what they load first

    @property
    def constraints(self) -> list[Constraint]:
        return self.settings.feasibility

    @property
    def profile(self) -> HardwareProfile:
        return self.hardware.profile

    @property
    def workdir(self) -> Path:
        return studies.trial_folder(self.storage_url, self.name, self.request.storage.cache_dir)

    def trial_workdir(self, number: int) -> Path:
        return trial_workdir(self.workdir, number)


def trial_workdir(workdir: Path, number: int) -> Path:
    return workdir / f"trial-{number:04d}"


def open_session(checked: Checked, prepared: Prepared, events: SearchEvents, queue: bool = True) -> Session:
    """Create the study, or load it to resume; store what the report needs; recover interrupted trials; queue the
    anchors (and the front a warm start names) unless told not to (`autotune evaluate` runs no trial)."""
    request = checked.request
    patient_storage = checked.patient_storage or open_patient_storage(request, checked.storage_url, events)
    for_tests.hold("study")
    study, space, settings = _create_or_load(checked, patient_storage, prepared)
    artifact_store = artifacts.open_store(request.storage.artifacts, checked.storage_url)
    if request.workload.traffic is not None:  # the study's copy of its requests, for workers elsewhere
        store_window(artifact_store, study, request.workload.traffic, request.storage.cache_dir)
    if not checked.joining:
        settings.prepared = prepared.facts()
        settings.space = space.to_json()
        studies.update_settings(study, settings)
    study_id = patient_storage.get_study_id_from_name(checked.name)
    claims = Claims(patient_storage.engine, study_id, patient_storage.patience)
    recovery = Recovery(study, claims, checked.workdir, _log_attacher(artifact_store, checked.workdir), events.note)
    compile_archives = CompileArchives(artifact_store, request.storage.cache_dir, study, events.note)
    session = Session(
        request, checked.hardware, space, checked.name, checked.storage_url, patient_storage, study, settings, prepared,
        claims=claims, artifact_store=artifact_store, recovery=recovery, compile_archives=compile_archives,
    )  # fmt: skip
    recovery()
    if queue:
        _enqueue_anchors(study, prepared)
    if request.warm_start:
        previous, previous_url = find_warm_start(request, checked.storage_url, events)
        _enqueue_warm_start(study, previous, space, events)
        _adopt_compiled_code(session, previous, previous_url, events)
    _say_opened(session, events)
    return session


def _create_or_load(
    checked: Checked, patient_storage: PatientStorage, prepared: Prepared
) -> tuple[optuna.Study, SearchSpace, StudySettings]:
    """The study, its space and its settings: a new study holds the reference and the baseline in its space; a study
    resumed or joined keeps the space it stores."""
    name, seed = checked.name, checked.request.seed
    settings = replace(checked.settings)  # the session's own: what is stored changes it
    existing = checked.existing
    if existing is None:
        space = checked.space.including(prepared.reference_config).including(prepared.baseline_config)
        settings.space = space.to_json()
        study = studies.create_study(patient_storage, name, settings, seed)
        if study is not None:
            return study, space, settings
        existing = studies.load_existing(patient_storage, name, seed)  # another search created it meanwhile: join it
        settings.check_resumable(studies.wait_for_settings(existing), name)
    study = studies.load_existing(patient_storage, name, seed)
    return study, SearchSpace.from_json(studies.stored_settings(study).space), settings


def _log_attacher(artifact_store: Any, workdir: Path) -> LogAttacher:
    """Stores the local log of a trial another process of this host left running, if there is one."""

    def attach_log(storage: optuna.storages.BaseStorage, trial_id: int, number: int) -> None:
        log = trial_workdir(workdir, number) / "worker.log"
        artifacts.attach_to_trial_id(artifact_store, storage, trial_id, log)

    return attach_log


def _say_opened(session: Session, events: SearchEvents) -> None:
    stored = sum(1 for record in studies.records(session.study) if record.launched and record.outcome)
    events.note(
        f"study {session.name} in {studies.redact(session.storage_url)}: profile {session.profile.name}, "
        f"{session.space.size()} configurations in the space, {stored} trials stored"
    )
    if session.settings.constraints:
        events.note(f"constraints: {', '.join(session.settings.constraints)} (feasible trials only on the front)")


def open_patient_storage(request: SearchRequest, url: str, events: SearchEvents) -> PatientStorage:
    """The study's storage, opened and used through an outage (storage_waiting)."""
    return studies.open_storage(url, storage_waiting(request.storage.patience_s, events))


def storage_waiting(patience_s: float, events: SearchEvents) -> studies.Waiting:
    """How a search or a worker waits out its storage: for --storage-patience, saying so in its notes, and ending a
    wait at its next try when a signal asks it to stop."""
    return studies.Waiting(patience_s, events.note, interrupts.signalled)


def check_search(request: SearchRequest, events: SearchEvents) -> Checked:
    """Check every input before anything is written: hardware, space, model path, existing study."""
    hardware = resolve_hardware(request.hardware.gpu, request.hardware.device)
    if hardware.note:
        events.note(hardware.note)
    declared = load_space(request.space_path or default_space_path())
    space = runnable_space(declared, hardware.profile, plan_target(hardware.profile, request))
    for line in uninstalled_notes(space):
        events.note(line)
    _check_model_argument(request.model.id)
    name = request.storage.study_name or studies.default_study_name(request.model.id, hardware.profile.name)
    url = request.storage.url or studies.default_storage_url(name, request.storage.studies_dir)
    settings = StudySettings(
        model=request.model.id,
        revision=request.model.revision,
        profile=hardware.profile,
        space_fingerprint=declared.fingerprint(),
        space=space.to_json(),
        workload=request.workload,
        quality=request.quality,
        constraints=[str(constraint) for constraint in request.constraints],
    )
    if request.objectives:
        settings.objectives = list(request.objectives)
    patient_storage, existing = None, None
    if not studies.sqlite_file_missing(url):
        patient_storage = open_patient_storage(request, url, events)
        existing = studies.find_study(patient_storage, name)
        if existing is not None:
            stored = studies.stored_settings(existing)
            settings.objectives = settings.objectives if request.objectives else stored.objectives  # none given: keep
            settings.constraints = constraints_on_resume(request, settings.constraints, stored.constraints)
            settings.check_resumable(stored, name)
            settings.constraints = settings.constraints or stored.constraints  # none given: keep the study's
    _check_objectives(settings, hardware)
    if request.warm_start:
        find_warm_start(request, url, events)  # bad input now, before anything is written
    artifacts.check_location(request.storage.artifacts, url)  # bad input now, before anything is written
    return Checked(request, hardware, space, name, url, patient_storage, existing, settings)


def constraints_on_resume(request: SearchRequest, asked: list[str], stored: list[str]) -> list[str]:
    """The constraints a resumed study is searched under: those asked, or, where they are a preset's guard and the
    study was searched under another (the preset's guard of an earlier version), the study's own."""
    return list(stored) if request.preset_guard and stored else asked


def uninstalled_notes(space: SearchSpace) -> list[str]:
    """One line per extra to install: the knob values left out of the space because their packages are missing."""
    left_out: dict[str, dict[str, list[str]]] = {}  # install line -> knob -> values
    for knob, values in space.removed.items():
        for value, reason in values.items():
            package = rules.missing_package(knob, value)
            if package is None or reason != rules.why_not_installed(knob, value):
                continue  # removed for another reason (the hardware), before its packages were looked at
            left_out.setdefault(package.install, {}).setdefault(knob, []).append(value)
    return [
        "not searched, their packages are not installed here: "
        + "; ".join(f"{knob}={', '.join(values)}" for knob, values in knobs.items())
        + f" ({install})"
        for install, knobs in left_out.items()
    ]


def _check_objectives(settings: StudySettings, hardware: ResolvedHardware) -> None:
    """An objective this device or workload cannot measure is bad input, not a study of failed trials."""
    counter = ENERGY in settings.objectives and has_energy_counter(hardware.device)
    device_type = "cuda" if hardware.device.startswith("cuda") else "cpu"
    untraced = KINDS[settings.workload.kind].untraced(settings.workload)
    check_available(settings.objectives, settings.workload.kind, metrics_of_one_kind(), device_type, counter, untraced)


def find_warm_start(request: SearchRequest, url: str, events: SearchEvents) -> tuple[optuna.Study, str]:
    """The study named by --warm-start, and its storage's URL: in this study's storage, or in its own default SQLite
    file."""
    assert request.warm_start is not None
    for candidate in (url, studies.default_storage_url(request.warm_start, request.storage.studies_dir)):
        if not studies.sqlite_file_missing(candidate):
            found = studies.find_study(open_patient_storage(request, candidate, events), request.warm_start)
            if found is not None:
                return found, candidate
    raise UserError(f"--warm-start: no study named {request.warm_start!r} in {studies.redact(url)} nor in its own file")


def check_worker(worker: WorkerRequest, events: SearchEvents) -> tuple[Checked, Config]:
    """A worker joining an existing study: everything comes from the study; returns its reference too."""
    name, url = worker.storage.study_name, worker.storage.url
    assert name is not None and url is not None
    if studies.sqlite_file_missing(url):
        raise studies.no_study(name, url)
    patient_storage = studies.open_storage(url, storage_waiting(worker.storage.patience_s, events))
    study = studies.stored_study(patient_storage, name, url)
    stored = studies.stored_settings(study)
    hardware = hardware_for(stored.profile, worker.device)
    if hardware.note:
        events.note(hardware.note)
    _check_objectives(stored, hardware)
    space = SearchSpace.from_json(stored.space)
    request = _joined(worker, stored)
    checked = Checked(request, hardware, space, name, url, patient_storage, study, stored, joining=True)
    artifacts.check_location(worker.storage.artifacts, url)
    if stored.workload.traffic is not None:  # its requests on this machine, before anything runs
        store = artifacts.open_store(worker.storage.artifacts, url)
        given = Path(worker.traffic) if worker.traffic else None
        fetch_window(store, study, stored.workload.traffic, worker.storage.cache_dir, given)
    return checked, stored.prepared.reference_config


def _joined(worker: WorkerRequest, stored: StudySettings) -> SearchRequest:
    """The request of a worker: the study's model, workload, quality and constraints, with this worker's limits."""
    return SearchRequest(
        model=ModelSpec(stored.model, revision=stored.revision, trust_remote_code=worker.trust_remote_code),
        hardware=HardwareSpec(device=worker.device),
        workload=stored.workload,
        quality=stored.quality,
        budget=worker.budget,
        storage=worker.storage,
        constraints=tuple(parse_constraints(stored.constraints)),
        run_id=worker.run_id,
    )


def _check_model_argument(model: str) -> None:
    looks_local = model.startswith(("/", "./", "../", "~")) or Path(model).exists()
    if looks_local:
        path = Path(model).expanduser()
        if not path.is_dir():
            raise UserError(f"model path {model} does not exist or is not a directory; pass a hub id or a local folder")
        if not os.access(path, os.R_OK) or not (path / "config.json").is_file():
            raise UserError(f"model folder {model} has no readable config.json; pass a folder saved by save_pretrained")


def _enqueue_anchors(study: optuna.Study, prepared: Prepared) -> None:
    """The reference and the baseline are measured first, so every report can compare with them."""
    reference, baseline = prepared.reference_config, prepared.baseline_config
    anchors = [(reference, ["reference"])]
    if config_key(baseline) == config_key(reference):
        anchors = [(reference, ["reference", "baseline"])]
    else:
        anchors.append((baseline, ["baseline"]))
    _enqueue_new(study, anchors)


def _enqueue_warm_start(study: optuna.Study, previous: optuna.Study, space: SearchSpace, events: SearchEvents) -> None:
    """The front of another study (last night's, say) is measured first: the environment may have changed."""
    front = front_numbers(previous)
    configs = [space.normalize(record.config) for record in studies.records(previous) if record.number in front]
    runnable = [config for config in configs if space.violation(config) is None]
    added = _enqueue_new(study, [(config, ["warm-start"]) for config in runnable])
    events.note(
        f"warm start: {added} of the {len(configs)} configurations on the front of {previous.study_name} queued"
    )


def _adopt_compiled_code(session: Session, previous: optuna.Study, previous_url: str, events: SearchEvents) -> None:
    """The warm start's archives of compiled code, taken as this study's: its trials of the same graphs find them."""
    store = session.artifact_store
    if previous_url != session.storage_url:
        store = artifacts.open_store(session.request.storage.artifacts, previous_url)
    taken = session.compile_archives.adopt(session.study, previous, store)
    if taken:
        what = f"archives of what {previous.study_name} compiled"
        events.note(f"warm start: {taken} {what}, loaded by this study's trials before they compile")


def _enqueue_new(study: optuna.Study, configs: list[tuple[Config, list[str]]]) -> int:
    """Queue configurations that are neither measured nor already waiting; how many were queued.

    Not Optuna's skip_if_exists: a configuration stopped by the budget or interrupted must run again.
    """
    seen = studies.measured_keys(study)
    waiting = {config_key(t.params) for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))}
    added = 0
    for config, roles in configs:
        key = config_key(config)
        if key not in seen and key not in waiting:
            study.enqueue_trial(config, user_attrs={"roles": roles})
            waiting.add(key)
            added += 1
    return added
