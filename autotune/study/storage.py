"""Where a study lives: storage URLs, opening SQLite or PostgreSQL, creating, finding and loading studies."""

from __future__ import annotations

import copy
import fnmatch
import logging
import re
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial

from autotune.errors import UserError
from autotune.extras import installed, why_storage_missing
from autotune.study.claims import OWNER_ATTR, WORKER_PID_ATTR
from autotune.study.patience import DEFAULT_PATIENCE_S, Patience, PatientStorage
from autotune.study.records import FAIL_REASON_ATTR, MAX_INTERRUPTIONS
from autotune.study.settings import StudySettings, name_metrics, update_settings

log = logging.getLogger(__name__)

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
HEARTBEAT_INTERVAL_S = 30

GRACE_PERIOD_S = 120

POSTGRES_CONNECT_TIMEOUT_S = 5


def default_study_name(model: str, profile: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "--", model.strip("/")).strip("-") or "model"
    return f"{slug}-{profile}"


def default_storage_url(study_name: str, studies_dir: Path = Path("studies")) -> str:
    return f"sqlite:///{studies_dir / study_name}.db"


def trial_folder(url: str, study_name: str, cache_dir: Path) -> Path:
    """Where a study's prepare and trial files go: beside its SQLite file, else in the cache folder."""
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///")).parent / study_name
    return cache_dir / "studies" / study_name


def redact(url: str) -> str:
    """A storage URL with its password replaced, for messages and the report."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def open_storage(
    url: str, patience_s: float = DEFAULT_PATIENCE_S, say: Callable[[str], None] | None = None
) -> PatientStorage:
    """The storage at `url`. Opening it is not retried (a server that cannot be reached now is most likely a wrong
    URL: bad input); each call after that is retried through an outage of up to `patience_s` (study/patience.py),
    `say` printing when one starts and ends."""
    driver_url = with_installed_driver(url)
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(SCHEMA_RACE_ATTEMPTS):
        try:
            patient_storage = PatientStorage(
                driver_url,
                engine_kwargs=_engine_arguments(url, patience_s),
                heartbeat_interval=HEARTBEAT_INTERVAL_S,
                grace_period=GRACE_PERIOD_S,
                heartbeat_stale_trial_callback=RetryInterrupted(max_retry=MAX_INTERRUPTIONS),
            )
        except sqlalchemy.exc.DatabaseError as error:
            if not _lost_schema_race(error):
                raise UserError(f"cannot open storage {redact(url)}: {_first_line(error)}; check --storage") from None
            time.sleep(0.2 * (attempt + 1))  # another process created the schema meanwhile: it is there now
            continue
        except Exception as error:  # SQLAlchemy raises many kinds: a bad URL, a missing driver, a refused connection
            raise UserError(f"cannot open storage {redact(url)}: {_first_line(error)}; check --storage") from None
        sqlite_file = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None
        patient_storage.patience = Patience(patience_s, redact(url), say or log.warning, sqlite_file)
        return patient_storage
    raise UserError(f"cannot open storage {redact(url)}: its schema could not be created; check --storage")


def _engine_arguments(url: str, patience_s: float) -> dict[str, Any]:
    if url.startswith("sqlite"):  # SQLite waits this long for a lock before it says "database is locked"
        return {"connect_args": {"timeout": min(SQLITE_LOCK_WAIT_S, patience_s)}}
    arguments: dict[str, Any] = {"pool_pre_ping": True}  # a connection the server dropped is replaced, not used
    if url.startswith("postgresql"):  # an unreachable server is an error in seconds, not after the OS gives up
        arguments["connect_args"] = {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S}
    return arguments


SQLITE_LOCK_WAIT_S = 60.0


def with_installed_driver(url: str) -> str:
    """`postgresql://` as users write it, for the driver installed here: SQLAlchemy's default for that scheme is
    psycopg2, and where only psycopg 3 (the postgres extra) is installed, it serves the URL instead."""
    missing = why_storage_missing(url)
    if missing:
        raise UserError(missing)
    scheme, rest = url.split("://", 1) if "://" in url else (url, "")
    if scheme == "postgresql" and not installed("psycopg2"):
        return f"postgresql+psycopg://{rest}"
    return url


# What a retry does not take from the trial it retries: its failure, and the processes that ran it. A retry popped by a
# worker that had not written itself as owner yet carried the dead owner, and another worker's recovery failed it.
NOT_RETRIED_ATTRS = (FAIL_REASON_ATTR, OWNER_ATTR, WORKER_PID_ATTR)


class RetryInterrupted(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry, without the interrupted trial's failure reason, log and processes (it copies every
    attribute)."""

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        trial = copy.copy(trial)
        trial.user_attrs = {key: value for key, value in trial.user_attrs.items() if key not in NOT_RETRIED_ATTRS}
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


def load_stored_study(url: str, name: str, patience_s: float = DEFAULT_PATIENCE_S) -> optuna.Study:
    """An existing study, without creating a database or a study when there is none."""
    study = None if sqlite_file_missing(url) else find_study(open_storage(url, patience_s), name)
    if study is None:
        raise UserError(f"no study named {name!r} in {redact(url)}; check --study and --storage")
    return study


def studies_named(names: list[str], url: str | None, studies_dir: Path = Path("studies")) -> list[tuple[str, str]]:
    """(study, storage URL) for each name or glob pattern ("demo-cpu-2026-11-*"): matched among the studies
    of `url`, or, without one, among the SQLite files of `studies_dir` (each study's default storage)."""
    found: dict[str, str] = {}
    for name in names:
        if not any(char in name for char in "*?["):
            found.setdefault(name, url or default_storage_url(name, studies_dir))
            continue
        matches = _matching(name, url, studies_dir)
        if not matches:
            where = redact(url) if url else f"{studies_dir}/*.db"
            raise UserError(f"no study matches {name!r} in {where}; check --studies and --storage")
        for match in matches:
            found.setdefault(match, url or default_storage_url(match, studies_dir))
    return list(found.items())


def _matching(pattern: str, url: str | None, studies_dir: Path) -> list[str]:
    if url is None:
        return sorted(path.stem for path in studies_dir.glob(f"{pattern}.db"))
    if sqlite_file_missing(url):
        return []
    names = [summary.study_name for summary in open_storage(url).get_all_studies()]
    return sorted(name for name in names if fnmatch.fnmatchcase(name, pattern))


def find_study(storage: optuna.storages.BaseStorage, name: str) -> optuna.Study | None:
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None


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


def make_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True)
