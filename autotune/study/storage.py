"""Where a study lives: storage URLs, opening SQLite or PostgreSQL, creating, finding and loading studies."""

from __future__ import annotations

import copy
import fnmatch
import logging
import re
import socket
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial

from autotune import for_tests
from autotune.errors import UserError
from autotune.extras import installed, why_storage_missing
from autotune.study.claims import OWNER_ATTR, WORKER_PID_ATTR
from autotune.study.patience import (
    DEFAULT_WAITING,
    UNREACHABLE,
    Patience,
    PatientStorage,
    Waiting,
    storage_problem,
)
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


def open_storage(url: str, waiting: Waiting = DEFAULT_WAITING) -> PatientStorage:
    """The storage at `url`, opened through an outage of up to `waiting.limit_s` (a server shutting down or starting
    up, a dropped connection, too many connections, a lock, a full disk, a connection refused by a host that
    resolves); each call after that is retried the same way (study/patience.py), `waiting.say` printing when an
    outage starts and ends. What no wait can fix is bad input at once (why_never_opens)."""
    driver_url = with_installed_driver(url)
    sqlite_file = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None
    if sqlite_file is not None:
        sqlite_file.parent.mkdir(parents=True, exist_ok=True)
    patience = Patience(waiting.limit_s, redact(url), waiting.say, sqlite_file)
    patience.interrupted = waiting.interrupted
    for_tests.hold_once_connected("open")
    for attempt in range(SCHEMA_RACE_ATTEMPTS):
        try:
            patient_storage = patience.call(lambda: _new_storage(url, driver_url, waiting.limit_s))
        except sqlalchemy.exc.DatabaseError as error:
            if not _lost_schema_race(error):
                raise
            time.sleep(0.2 * (attempt + 1))  # another process created the schema meanwhile: it is there now
            continue
        patient_storage.patience = patience
        return patient_storage
    raise UserError(f"cannot open storage {redact(url)}: its schema could not be created; check --storage")


def _new_storage(url: str, driver_url: str, patience_s: float) -> PatientStorage:
    """One attempt at opening the storage; a UserError when no attempt can succeed."""
    try:
        return PatientStorage(
            driver_url,
            engine_kwargs=_engine_arguments(url, patience_s),
            heartbeat_interval=HEARTBEAT_INTERVAL_S,
            grace_period=GRACE_PERIOD_S,
            heartbeat_stale_trial_callback=RetryInterrupted(max_retry=MAX_INTERRUPTIONS),
        )
    except Exception as error:  # SQLAlchemy raises many kinds: a bad URL, a missing driver, a refused connection
        never = None if _lost_schema_race(error) else why_never_opens(error, url)
        if never is None:
            raise  # an outage (the patience waits it out), or a schema another process is creating
    # Raised outside the handler, so that the patience finds no driver's error behind it to wait out.
    raise UserError(f"cannot open storage {redact(url)}: {never}; check --storage")


# What a server says when it refuses a login or a database, which no wait changes: PostgreSQL's words (in English, its
# default lc_messages; in another language they read as an outage) and MySQL's.
REFUSALS = (
    "authentication failed",  # a rejected password, certificate, ident or peer login
    "no password supplied",
    "does not exist",  # the database, or the user
    "no pg_hba.conf entry",
    "permission denied",
    "access denied",
    "unknown database",
)


def why_never_opens(error: Exception, url: str) -> str | None:
    """Why the storage at `url` cannot be opened however long one waits, from the error an attempt met: a malformed
    URL, a missing driver, an SQLite file that cannot be opened, a server that refuses the login or the database, a
    host that does not resolve. None for an outage that passes: a server shutting down or starting up, too many
    connections, a lock, a full disk, a connection refused or reset by a host that resolves."""
    problem = storage_problem(error)
    if problem is None:
        return _first_line(error)
    if problem.cause == UNREACHABLE:
        refused = any(words in problem.detail.lower() for words in REFUSALS)
        if refused or _unknown_host(url):
            return redact(problem.detail)
    return None


def _unknown_host(url: str) -> bool:
    """Whether the host of `url` does not resolve (a name server that cannot answer now is an outage)."""
    try:
        host = sqlalchemy.engine.make_url(url).host
    except sqlalchemy.exc.ArgumentError:
        return False
    if not host or "," in host:  # a local socket, or several hosts: the driver says
        return False
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror as error:
        return error.errno != socket.EAI_AGAIN
    return False


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


def load_stored_study(url: str, name: str, waiting: Waiting = DEFAULT_WAITING) -> optuna.Study:
    """An existing study, without creating a database or a study when there is none."""
    if sqlite_file_missing(url):
        raise no_study(name, url)
    return stored_study(open_storage(url, waiting), name, url)


def stored_study(storage: optuna.storages.BaseStorage, name: str, url: str) -> optuna.Study:
    """The study of this name in `storage` (at `url`); a UserError when there is none."""
    study = find_study(storage, name)
    if study is None:
        raise no_study(name, url)
    return study


def no_study(name: str, url: str) -> UserError:
    return UserError(f"no study named {name!r} in {redact(url)}; check --study and --storage")


def studies_named(
    names: list[str], url: str | None, studies_dir: Path = Path("studies"), waiting: Waiting = DEFAULT_WAITING
) -> list[tuple[str, str]]:
    """(study, storage URL) for each name or glob pattern ("demo-cpu-2026-11-*"): matched among the studies
    of `url`, or, without one, among the SQLite files of `studies_dir` (each study's default storage)."""
    found: dict[str, str] = {}
    for name in names:
        if not any(char in name for char in "*?["):
            found.setdefault(name, url or default_storage_url(name, studies_dir))
            continue
        matches = _matching(name, url, studies_dir, waiting)
        if not matches:
            where = redact(url) if url else f"{studies_dir}/*.db"
            raise UserError(f"no study matches {name!r} in {where}; check --studies and --storage")
        for match in matches:
            found.setdefault(match, url or default_storage_url(match, studies_dir))
    return list(found.items())


def _matching(pattern: str, url: str | None, studies_dir: Path, waiting: Waiting) -> list[str]:
    if url is None:
        return sorted(path.stem for path in studies_dir.glob(f"{pattern}.db"))
    if sqlite_file_missing(url):
        return []
    names = [summary.study_name for summary in open_storage(url, waiting).get_all_studies()]
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
