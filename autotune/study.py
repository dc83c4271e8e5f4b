"""The Optuna study: storage, the settings a study is bound to, and trials as autotune records.

Everything the report needs is stored here (study and trial user attributes), so a report can be
rendered again from storage alone, on any machine.
"""

from __future__ import annotations

import copy
import logging
import re
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from autotune.constraints import Constraint, violations
from autotune.errors import StudyMismatchError, UserError
from autotune.metrics import OBJECTIVES, Metric, objectives_named
from autotune.optuna_internals import set_study_system_attr, study_system_attrs
from autotune.results import Outcome, TaskResult
from autotune.space import Config, SearchSpace, config_key

log = logging.getLogger(__name__)

# autotune's own study records live in system attributes (Optuna's tools list user attributes in one row);
# studies made before that keep them in user attributes, where they are still read.
SETTINGS_ATTR = "autotune"
RUNS_ATTR = "search_runs"
EXCLUSIONS_ATTR = "exclusions"
ARTIFACT_PREFIX = "artifacts:"  # Optuna's system attribute of each uploaded artifact
FAIL_REASON_ATTR = "fail_reason"  # one line, on every failed trial, where Optuna's tools show it
HEARTBEAT_INTERVAL_S = 30
GRACE_PERIOD_S = 120
POSTGRES_CONNECT_TIMEOUT_S = 5
MAX_INTERRUPTIONS = 1  # an interrupted configuration is retried once, then never run again

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def default_study_name(model: str, profile: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "--", model.strip("/")).strip("-") or "model"
    return f"{slug}-{profile}"


def default_storage(study_name: str, studies_dir: Path = Path("studies")) -> str:
    return f"sqlite:///{studies_dir / study_name}.db"


def trial_folder(url: str, study_name: str, cache_dir: Path) -> Path:
    """Where a study's prepare and trial files go: beside its SQLite file, else in the cache folder."""
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///")).parent / study_name
    return cache_dir / "studies" / study_name


def redact(url: str) -> str:
    """A storage URL with its password replaced, for messages and the report."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def open_storage(url: str) -> optuna.storages.RDBStorage:
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    if url.startswith("postgresql"):  # an unreachable server is an error in seconds, not after the OS gives up
        engine_kwargs["connect_args"] = {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S}
    for attempt in range(SCHEMA_RACE_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=HEARTBEAT_INTERVAL_S,
                grace_period=GRACE_PERIOD_S,
                heartbeat_stale_trial_callback=RetryInterrupted(max_retry=MAX_INTERRUPTIONS),
            )
        except sqlalchemy.exc.DatabaseError as error:
            if not _lost_schema_race(error):
                raise UserError(f"cannot open storage {redact(url)}: {_first_line(error)}; check --storage") from None
            time.sleep(0.2 * (attempt + 1))  # another process created the schema meanwhile: it is there now
        except Exception as error:  # SQLAlchemy raises many kinds: a bad URL, a missing driver, a refused connection
            raise UserError(f"cannot open storage {redact(url)}: {_first_line(error)}; check --storage") from None
    raise UserError(f"cannot open storage {redact(url)}: its schema could not be created; check --storage")


class RetryInterrupted(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry, without the interrupted trial's failure reason and log (it copies every attribute)."""

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        trial = copy.copy(trial)
        trial.user_attrs = {key: value for key, value in trial.user_attrs.items() if key != FAIL_REASON_ATTR}
        trial.system_attrs = {
            key: value for key, value in trial.system_attrs.items() if not key.startswith("artifacts:")
        }
        super().__call__(study, trial)


SCHEMA_RACE_ATTEMPTS = 5
# What SQLite and PostgreSQL say when two processes create the same new schema at once.
SCHEMA_RACE_MARKERS = ("already exists", "UNIQUE constraint failed", "duplicate key")


def _lost_schema_race(error: Exception) -> bool:
    return any(marker in str(error) for marker in SCHEMA_RACE_MARKERS)


def _first_line(error: Exception) -> str:
    return redact(str(error).splitlines()[0] if str(error) else type(error).__name__)


def sqlite_file_missing(url: str) -> bool:
    """True for an SQLite URL whose file does not exist yet (opening it would create it)."""
    return url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists()


def load_stored_study(url: str, name: str) -> optuna.Study:
    """An existing study, without creating a database or a study when there is none."""
    study = None if sqlite_file_missing(url) else find_study(open_storage(url), name)
    if study is None:
        raise UserError(f"no study named {name!r} in {redact(url)}; check --study and --storage")
    return study


def find_study(storage: optuna.storages.BaseStorage, name: str) -> optuna.Study | None:
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None


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

    def to_json(self) -> dict[str, Any]:
        if self == PreparedFacts():
            return {}
        return {
            "model_info": self.model_info,
            "model_path": self.model_path,
            "environment": self.environment,
            "reference": {"config": self.reference_config, "perplexity": self.reference_perplexity},
            "baseline": {"config": self.baseline_config},
            "device": self.device,
            "hardware_note": self.hardware_note,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PreparedFacts:
        reference, baseline = data.get("reference") or {}, data.get("baseline") or {}
        return cls(
            model_path=data.get("model_path"),
            model_info=data.get("model_info") or {},
            environment=data.get("environment") or {},
            reference_config=reference.get("config"),
            reference_perplexity=reference.get("perplexity"),
            baseline_config=baseline.get("config"),
            device=data.get("device"),
            hardware_note=data.get("hardware_note"),
        )


@dataclass
class StudySettings:
    """What a study is bound to: resuming with other values would mix figures that do not compare."""

    model: str
    revision: str | None
    profile: dict[str, Any]
    space_fingerprint: str
    space: dict[str, Any]
    workload: dict[str, Any]
    quality: dict[str, Any]
    prepared: PreparedFacts = field(default_factory=PreparedFacts)  # stored as "extra"
    constraints: list[str] = field(default_factory=list)  # `search --constraint`, as str(Constraint)
    # metric names, in the order Optuna stores their values; studies stored before it have the default three
    objectives: list[str] = field(default_factory=lambda: [metric.name for metric in OBJECTIVES])

    BINDING = ("model", "revision", "space_fingerprint", "workload", "quality", "objectives")

    def to_json(self) -> dict[str, Any]:
        data = {key: getattr(self, key) for key in self.__dataclass_fields__ if key != "prepared"}
        return {**data, "extra": self.prepared.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StudySettings:
        values = {key: data.get(key) for key in cls.__dataclass_fields__}
        values["prepared"] = PreparedFacts.from_json(data.get("extra") or {})
        values["constraints"] = list(data.get("constraints") or [])
        values["objectives"] = list(data.get("objectives") or [metric.name for metric in OBJECTIVES])
        return cls(**values)

    @property
    def objective_metrics(self) -> tuple[Metric, ...]:
        return objectives_named(self.objectives)

    def check_resumable(self, stored: StudySettings, name: str) -> None:
        """Refuse to resume a study created with other binding settings."""
        for key in self.BINDING:
            if getattr(self, key) != getattr(stored, key):
                label = {"space_fingerprint": "search space"}.get(key, key)
                raise StudyMismatchError(
                    f"study {name!r} was created with another {label} ({_short(getattr(stored, key))}, "
                    f"now {_short(getattr(self, key))}); pass --study NEW_NAME to start a new study"
                )
        if self.profile["name"] != stored.profile["name"]:
            raise StudyMismatchError(
                f"study {name!r} was created for --gpu {stored.profile['name']}, not {self.profile['name']}; "
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


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def create_study(
    storage: optuna.storages.BaseStorage, name: str, settings: StudySettings, seed: int | None
) -> optuna.Study | None:
    """A new study with its settings; None when another process created one of that name first."""
    try:
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            directions=[metric.direction for metric in settings.objective_metrics],
            sampler=make_sampler(seed),
        )
    except optuna.exceptions.DuplicatedStudyError:
        return None
    update_settings(study, settings)
    return study


def load_existing(storage: optuna.storages.BaseStorage, name: str, seed: int | None) -> optuna.Study:
    study = optuna.load_study(study_name=name, storage=storage, sampler=make_sampler(seed))
    if study.metric_names is None:  # created before autotune named them
        name_metrics(study)
    return study


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


def make_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True)


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
    workload = settings.workload
    shape = f"{workload['batch_size']} prompts x {workload['input_len']} tokens -> {workload['output_len']} tokens"
    return {
        "model": settings.model + (f"@{settings.revision}" if settings.revision else ""),
        "profile": settings.profile["name"],
        "workload": f"{workload.get('kind', 'throughput')}, {shape}",
        "constraints": ", ".join(settings.constraints) or "none",
    }


# ------------------------------------------------------------------------------------------- trials


@dataclass(frozen=True)
class TrialRecord:
    """One trial as autotune sees it, read back from storage."""

    number: int
    state: str
    config: Config
    roles: tuple[str, ...]
    outcome: str | None  # None: skipped or still running
    message: str
    phase: str | None
    metrics: dict[str, float]
    timings: dict[str, float]
    environment: dict[str, Any]
    plan: dict[str, Any] | None
    skipped: str | None
    duration_s: float | None
    pid: int | None
    log_tail: str
    config_key: str | None = None
    interrupted: bool = False  # a signal stopped it, or its process died while it ran; retried once
    run_id: str | None = None  # the `search --devices` run whose worker measured it
    constraints: dict[str, float] = field(default_factory=dict)  # Optuna's values: feasible when all <= 0
    finished_at: datetime | None = None
    serve: dict[str, Any] | None = None  # serve workload: the command that ran, figures per load level

    @property
    def feasible(self) -> bool:
        return all(value <= 0 for value in self.constraints.values())

    @property
    def launched(self) -> bool:
        """Given to a worker: not skipped before launch, not still waiting in the queue."""
        return self.skipped is None and self.state != "WAITING"

    @property
    def complete(self) -> bool:
        return self.state == "COMPLETE"

    @classmethod
    def from_frozen(cls, trial: FrozenTrial) -> TrialRecord:
        attrs = trial.user_attrs
        duration = attrs.get("duration_s")
        died = trial.state == TrialState.FAIL and "outcome" not in attrs and "config_key" in attrs
        outcome, message = attrs.get("outcome"), attrs.get("message", "")
        interrupted = died or outcome == Outcome.INTERRUPTED
        if died:
            outcome = Outcome.CRASHED.value
            message = interrupted_message(attrs.get("owner") or {})
        return cls(
            number=trial.number,
            state=trial.state.name,
            config=attrs.get("config") or dict(trial.params),
            roles=tuple(attrs.get("roles", ())),
            outcome=outcome,
            message=message,
            phase=attrs.get("phase"),
            metrics=attrs.get("metrics", {}),
            timings=attrs.get("timings", {}),
            environment=attrs.get("environment", {}),
            plan=attrs.get("plan"),
            skipped=attrs.get("skipped"),
            duration_s=duration,
            pid=attrs.get("pid"),
            log_tail=attrs.get("log_tail", ""),
            config_key=attrs.get("config_key"),
            interrupted=interrupted,
            run_id=attrs.get("run_id"),
            constraints=dict(trial.constraints),
            finished_at=trial.datetime_complete,
            serve=attrs.get("serve"),
        )


def interrupted_message(owner: dict[str, Any]) -> str:
    return (
        f"interrupted: its process (pid {owner.get('pid')} on {owner.get('host')}) died or stopped "
        "sending heartbeats before the trial finished; retried once"
    )


def records(study: optuna.Study) -> list[TrialRecord]:
    return [TrialRecord.from_frozen(trial) for trial in study.get_trials(deepcopy=False)]


def measured_keys(study: optuna.Study) -> dict[str, int]:
    """Configurations already launched (or running elsewhere) -> the trial number that has them.

    A trial stopped by the budget, or interrupted (a signal, the death of its process), does not
    count: its configuration was never measured. An interrupted configuration is retried once; when
    its retry is interrupted too, it counts, so neither the planner nor the sampler brings it back.
    """
    seen: dict[str, int] = {}
    interruptions: dict[str, list[int]] = {}
    for record in records(study):
        if record.interrupted and record.config_key:
            interruptions.setdefault(record.config_key, []).append(record.number)
        unmeasured = record.outcome == Outcome.BUDGET or record.interrupted or record.skipped
        if record.config_key and not unmeasured and record.state in ("COMPLETE", "FAIL", "RUNNING"):
            seen.setdefault(record.config_key, record.number)
    for key, numbers in interruptions.items():
        if len(numbers) > MAX_INTERRUPTIONS:
            seen.setdefault(key, numbers[-1])
    return seen


def record_launch(trial: optuna.Trial, config: Config, plan: dict[str, Any], roles: list[str]) -> None:
    trial.set_user_attr("config", config)
    trial.set_user_attr("config_key", config_key(config))
    trial.set_user_attr("plan", plan)
    trial.set_user_attr("roles", roles)


def record_result(
    study: optuna.Study,
    trial: optuna.Trial,
    result: TaskResult,
    duration_s: float,
    constraints: Sequence[Constraint] = (),
    objectives: Sequence[Metric] = OBJECTIVES,
) -> None:
    """Store a result and finish the trial: COMPLETE with objective values, or FAIL with its reason.

    A complete trial also gets one Optuna constraint value per constraint (feasible when <= 0).
    """
    trial.set_user_attr("outcome", result.outcome.value)
    trial.set_user_attr("duration_s", duration_s)
    trial.set_user_attr("timings", result.timings)
    trial.set_user_attr("pid", result.pid)
    if result.environment:
        trial.set_user_attr("environment", result.environment)
    if result.ok:
        if result.details.plan is not None:  # the worker ran an adapted plan (e.g. another quantized-cache backend)
            trial.set_user_attr("plan", result.details.plan)
        if result.details.serve is not None:
            trial.set_user_attr("serve", result.details.serve)
        trial.set_user_attr("metrics", result.metrics)
        trial.set_user_attr("stats", result.stats)
        for key, value in violations(constraints, result.metrics).items():
            trial.set_constraint(key, value)
        study.tell(trial, [result.metrics[metric.name] for metric in objectives])
        return
    trial.set_user_attr("message", result.message)
    trial.set_user_attr(FAIL_REASON_ATTR, fail_reason(result.outcome.value, result.message))
    trial.set_user_attr("phase", result.phase)
    trial.set_user_attr("log_tail", result.log_tail[-3000:])
    study.tell(trial, state=TrialState.FAIL)


def fail_reason(outcome: str, message: str) -> str:
    """One short line: the outcome and the first line of its message."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    line = f"{outcome}: {first}" if first else outcome
    return line if len(line) <= 200 else line[:197] + "..."


def record_search_run(study: optuna.Study, run: dict[str, Any]) -> None:
    """Add one `autotune search` run (its elapsed time, budget, stop reason) to the study's history."""
    _set_system_attr(study, RUNS_ATTR, [*search_runs(study), run])


def search_runs(study: optuna.Study) -> list[dict[str, Any]]:
    return list(_system_attr(study, RUNS_ATTR) or [])


def record_skip(study: optuna.Study, trial: optuna.Trial, config: Config, reason: str) -> None:
    """A sampled configuration that is never launched (a rule forbids it, or it was measured already)."""
    trial.set_user_attr("config", config)
    trial.set_user_attr("skipped", reason)
    study.tell(trial, state=TrialState.PRUNED)


def exclusions(study: optuna.Study) -> dict[str, dict[str, str]]:
    return _system_attr(study, EXCLUSIONS_ATTR) or {}


def add_exclusion(study: optuna.Study, knob: str, value: Any, reason: str) -> None:
    """Remember a knob value that can never run in this environment (e.g. a missing package)."""
    current = exclusions(study)
    current.setdefault(knob, {})[str(value)] = reason
    _set_system_attr(study, EXCLUSIONS_ATTR, current)


def space_with_exclusions(space: SearchSpace, study: optuna.Study) -> SearchSpace:
    return space.forbidding(exclusions(study))
