"""What a study is bound to (model, workload, space, objectives), and the study-level records beside it."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import optuna

from autotune.errors import StudyMismatchError, UserError
from autotune.figures.constraints import MEETS_SLO, Constraint, parse_constraints
from autotune.figures.metrics import OBJECTIVES, PERPLEXITY, Metric, objectives_named
from autotune.profiles import HardwareProfile
from autotune.space import SearchSpace
from autotune.space.knobs import DeviceType
from autotune.specs import QualitySpec, WorkloadSpec
from autotune.study import migrations
from autotune.study.optuna_internals import set_study_system_attr, study_system_attrs
from autotune.traffic import TrafficRef
from autotune.traffic.shape import TrafficShape
from autotune.workloads import describe_workload, workload_as_run

log = logging.getLogger(__name__)
# autotune's own study records live in system attributes (Optuna's tools list user attributes in one row);
# studies made before that keep them in user attributes, where they are still read.
SETTINGS_ATTR = "autotune"

RUNS_ATTR = "search_runs"

EXCLUSIONS_ATTR = "exclusions"
SUSPICIONS_ATTR = "suspicions"

ARTIFACT_PREFIX = "artifacts:"  # Optuna's system attribute of each uploaded artifact


@dataclass
class PreparedFacts:
    """What the prepare step found on the machine that searched the study: the report shows them.

    Stored in the settings under "extra", in the layout studies have always had; empty until the
    first search has prepared the model.
    """

    model_path: str | None = None  # where the model loads from (the demo model's cache folder for `demo`)
    model_info: dict[str, Any] = field(default_factory=dict)  # parameters, checkpoint dtype, default attention
    environment: dict[str, Any] = field(default_factory=dict)  # versions, GPU
    reference_config: dict[str, Any] | None = None
    reference_perplexity: float | None = None
    baseline_config: dict[str, Any] | None = None
    device: str | None = None
    hardware_note: str | None = None  # e.g. the profile names a smaller GPU than the one measured on
    traffic: TrafficShape | None = None  # a trace's replayed requests, in the model's tokens

    def to_json(self) -> dict[str, Any]:
        if self == PreparedFacts():
            return {}
        traffic = {"traffic": self.traffic.to_json()} if self.traffic else {}  # studies of one shape: as before
        return {
            "model_info": self.model_info,
            "model_path": self.model_path,
            "environment": self.environment,
            "reference": {"config": self.reference_config, PERPLEXITY.name: self.reference_perplexity},
            "baseline": {"config": self.baseline_config},
            "device": self.device,
            "hardware_note": self.hardware_note,
        } | traffic

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PreparedFacts:
        reference, baseline = data.get("reference") or {}, data.get("baseline") or {}
        return cls(
            model_path=data.get("model_path"),
            model_info=data.get("model_info") or {},
            environment=data.get("environment") or {},
            reference_config=reference.get("config"),
            reference_perplexity=reference.get(PERPLEXITY.name),
            baseline_config=baseline.get("config"),
            device=data.get("device"),
            hardware_note=data.get("hardware_note"),
            traffic=TrafficShape.from_json(data["traffic"]) if data.get("traffic") else None,
        )


@dataclass
class StudySettings:
    """What a study is bound to: resuming with other values would mix figures that do not compare. Read from storage
    once, typed (older stored forms through autotune.study.migrations)."""

    model: str
    revision: str | None
    profile: HardwareProfile
    space_fingerprint: str
    space: dict[str, Any]
    workload: WorkloadSpec  # as its trials run it
    quality: QualitySpec
    prepared: PreparedFacts = field(default_factory=PreparedFacts)  # stored as "extra"
    constraints: list[str] = field(default_factory=list)  # `search --constraint`, as str(Constraint)
    # metric names, in the order Optuna stores their values; studies stored before it have the default three
    objectives: list[str] = field(default_factory=lambda: [metric.name for metric in OBJECTIVES])
    # quality measured on the prefill path: a study written before 2026-11-27 (never written again: it cannot resume)
    quality_on_prefill: bool = False

    BINDING = ("model", "revision", "space_fingerprint", "workload", "quality", "objectives")

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "revision": self.revision,
            "profile": self.profile.to_json(),
            "space_fingerprint": self.space_fingerprint,
            "space": self.space,
            "workload": self.workload.to_json(),
            "quality": asdict(self.quality),
            "constraints": self.constraints,
            "objectives": self.objectives,
            "extra": self.prepared.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StudySettings:
        quality = data.get("quality") or {}
        return cls(
            model=data["model"],
            revision=data.get("revision"),
            profile=HardwareProfile.from_json(migrations.profile(data.get("profile") or {})),
            space_fingerprint=data["space_fingerprint"],
            space=data.get("space") or {},
            workload=WorkloadSpec.from_json(migrations.workload(data.get("workload") or {})),
            quality=QualitySpec(**migrations.quality(quality)),
            prepared=PreparedFacts.from_json(data.get("extra") or {}),
            constraints=list(data.get("constraints") or []),
            objectives=migrations.objectives(data.get("objectives")),
            quality_on_prefill=migrations.quality_on_prefill(quality),
        )

    @property
    def device_type(self) -> DeviceType:
        """The device type of the study's hardware profile: cuda or cpu."""
        return self.profile.device_type

    def _bound(self, key: str) -> Any:
        """A binding setting as it compares, as plain data: a workload as its trials run it (every field, each kind's
        own)."""
        if key == "workload":  # its traffic by its requests, compared apart (check_resumable): a file may be renamed
            return {k: v for k, v in workload_as_run(self.workload.to_json()).items() if k != "traffic"}
        return asdict(self.quality) if key == "quality" else getattr(self, key)

    @property
    def feasibility(self) -> list[Constraint]:
        """What a trial must meet to be on the front: the study's --constraint flags, and its workload's SLO."""
        slo = [MEETS_SLO] if self.workload.slo else []
        return [*parse_constraints(self.constraints), *slo]

    @property
    def objective_metrics(self) -> tuple[Metric, ...]:
        return objectives_named(self.objectives)

    def check_resumable(self, stored: StudySettings, name: str) -> None:
        """Refuse to resume a study created with other binding settings."""
        if self.objectives != stored.objectives:  # before the workload: a preset sets both
            raise StudyMismatchError(
                f"study {name!r} optimises {', '.join(stored.objectives)}, not {', '.join(self.objectives)}; repeat "
                "its --objective/--objectives flags or give none to keep them, or pass --study NEW_NAME"
            )
        if stored.quality_on_prefill and not self.quality_on_prefill:
            raise StudyMismatchError(
                f"study {name!r} measured quality on the prefill path (it was written before 2026-11-27); new trials "
                "measure it through each configuration's own decoding path, and their figures would not compare; "
                "pass --study NEW_NAME to start a new study (report, best, compare and history still read this one)"
            )
        if self.workload.traffic != stored.workload.traffic:
            raise StudyMismatchError(
                f"study {name!r} replays {_traffic(stored.workload.traffic)}, not {_traffic(self.workload.traffic)}; "
                "pass --study NEW_NAME to start a new study"
            )
        for key in self.BINDING:
            if self._bound(key) != stored._bound(key):
                label = {"space_fingerprint": "search space"}.get(key, key)
                was, now = _differing(stored._bound(key), self._bound(key))
                raise StudyMismatchError(
                    f"study {name!r} was created with another {label} ({was}, now {now}); "
                    "pass --study NEW_NAME to start a new study"
                )
        if self.profile.name != stored.profile.name:
            raise StudyMismatchError(
                f"study {name!r} was created for --gpu {stored.profile.name}, not {self.profile.name}; "
                "pass --study NEW_NAME to start a new study"
            )
        if self.constraints and sorted(self.constraints) != sorted(stored.constraints):
            # Optuna keeps each finished trial's constraint values as they were told; new ones would
            # mix two feasible regions (a trial told without constraints counts as feasible).
            was = ", ".join(stored.constraints) or "no constraints"
            raise StudyMismatchError(
                f"study {name!r} was searched with {was}, not {', '.join(self.constraints)}; repeat the same "
                "--constraint flags or none to keep them, pass --study NEW_NAME to search with others, "
                "or apply them afterwards with `autotune best`"
            )


def _differing(stored: Any, given: Any) -> tuple[str, str]:
    """Two values of a setting, short: of two mappings (a workload), only the fields whose values differ."""
    if isinstance(stored, Mapping) and isinstance(given, Mapping):
        fields = [field for field in {**stored, **given} if stored.get(field) != given.get(field)]
        stored, given = ({field: values.get(field) for field in fields} for values in (stored, given))
    return _short(stored), _short(given)


def _traffic(traffic: TrafficRef | None) -> str:
    return traffic.describe() if traffic is not None else "one shape of requests (no --traffic)"


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def metric_names(objectives: Sequence[Metric] = OBJECTIVES) -> list[str]:
    """The objectives as Optuna's tools label them: what, and in which unit."""
    return [f"{metric.label} [{metric.unit}]" for metric in objectives]


def name_metrics(study: optuna.Study, objectives: Sequence[Metric] = OBJECTIVES) -> None:
    study.set_metric_names(metric_names(objectives))


def _system_attr(study: optuna.Study, key: str) -> Any:
    stored = study_system_attrs(study)
    return stored[key] if key in stored else study.user_attrs.get(key)


def _set_system_attr(study: optuna.Study, key: str, value: Any) -> None:
    set_study_system_attr(study, key, value)
    if key in study.user_attrs:  # a study made before: its copy there would keep `optuna studies` wide
        study.set_user_attr(key, MOVED_NOTE)


MOVED_NOTE = "kept in the study's system attributes"


def stored_settings(study: optuna.Study) -> StudySettings:
    data = _system_attr(study, SETTINGS_ATTR)
    if data is None:
        raise UserError(f"study {study.study_name!r} was not created by autotune; pass another --study")
    return StudySettings.from_json(data)


def wait_for_settings(study: optuna.Study, timeout_s: float = 30.0) -> StudySettings:
    """The settings of a study that another process has just created (it stores them right after)."""
    deadline = time.monotonic() + timeout_s
    while _system_attr(study, SETTINGS_ATTR) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return stored_settings(study)


def has_settings(study: optuna.Study) -> bool:
    return _system_attr(study, SETTINGS_ATTR) is not None


def update_settings(study: optuna.Study, settings: StudySettings) -> None:
    """Store the settings, the objectives' names, and a short summary that `optuna studies` can show."""
    _set_system_attr(study, SETTINGS_ATTR, settings.to_json())
    name_metrics(study, settings.objective_metrics)
    for key, value in settings_summary(settings).items():
        study.set_user_attr(key, value)


def settings_summary(settings: StudySettings) -> dict[str, str]:
    return {
        "model": settings.model + (f"@{settings.revision}" if settings.revision else ""),
        "profile": settings.profile.name,
        "workload": describe_workload(settings.workload),
        "constraints": ", ".join(settings.constraints) or "none",
    }


def record_search_run(study: optuna.Study, run: dict[str, Any]) -> None:
    """Add one `autotune search` run (its elapsed time, budget, stop reason) to the study's history."""
    _set_system_attr(study, RUNS_ATTR, [*search_runs(study), run])


def search_runs(study: optuna.Study) -> list[dict[str, Any]]:
    return list(_system_attr(study, RUNS_ATTR) or [])


def exclusions(study: optuna.Study) -> dict[str, dict[str, str]]:
    return _system_attr(study, EXCLUSIONS_ATTR) or {}


def add_exclusion(study: optuna.Study, knob: str, value: Any, reason: str) -> None:
    """Remember a knob value that can never run in this environment (e.g. a missing package)."""
    current = exclusions(study)
    current.setdefault(knob, {})[str(value)] = reason
    _set_system_attr(study, EXCLUSIONS_ATTR, current)
    clear_suspicion(study, knob, value)


def suspicions(study: optuna.Study) -> dict[str, dict[str, dict[str, Any]]]:
    """knob -> value -> {"trial", "config_key", "reason"}: values only the words of a failure point at."""
    return _system_attr(study, SUSPICIONS_ATTR) or {}


def add_suspicion(study: optuna.Study, knob: str, value: Any, trial: int, config_key: str, reason: str) -> None:
    current = suspicions(study)
    current.setdefault(knob, {})[str(value)] = {"trial": trial, "config_key": config_key, "reason": reason}
    _set_system_attr(study, SUSPICIONS_ATTR, current)


def clear_suspicion(study: optuna.Study, knob: str, value: Any) -> None:
    current = suspicions(study)
    if str(value) in current.get(knob, {}):
        del current[knob][str(value)]
        _set_system_attr(study, SUSPICIONS_ATTR, {name: values for name, values in current.items() if values})


def space_with_exclusions(space: SearchSpace, study: optuna.Study) -> SearchSpace:
    return space.forbidding(exclusions(study))
