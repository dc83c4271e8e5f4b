"""Storage that outlasts its database: a call that cannot get through is retried with backoff, for a bounded time.

A PostgreSQL server restarted for maintenance or failed over, a connection the server dropped, an SQLite file
another process holds locked, a full disk: each makes a storage call fail, and each usually passes. Every call
autotune makes to a study's storage (Optuna's RDBStorage, and the claims table beside it) goes through a
Patience: retried after 1 s, 2 s, 4 s, 8 s, then every 10 s, until it succeeds or the limit (--storage-patience)
has passed since the first failure, then StorageUnavailableError: one line, exit status 75. A new connection is
made for each retry where the old one was dropped (SQLAlchemy's pool_pre_ping and its disconnect detection).

An error that says something about the call itself (no such table, a constraint, bad data) is not retried.

Opening the storage waits out the same outages (study/storage.py): a server shutting down or starting up, too many
connections, a connection refused by a host that resolves. What no wait can fix there is bad input at once.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil
import sqlalchemy.exc
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from autotune.errors import StorageUnavailableError
from autotune.specs import DEFAULT_STORAGE_PATIENCE_S
from autotune.study.optuna_internals import PRIVATE_STORAGE_CALLS
from autotune.units import format_duration

log = logging.getLogger(__name__)

DEFAULT_PATIENCE_S = DEFAULT_STORAGE_PATIENCE_S  # --storage-patience
FIRST_WAIT_S = 1.0
LONGEST_WAIT_S = 10.0

Result = TypeVar("Result")

UNREACHABLE, LOCKED, FULL = "unreachable", "locked", "full"
_WORDS = {  # what each cause of a problem is called in the lines printed
    UNREACHABLE: "cannot reach its database",
    LOCKED: "is locked by another process",
    FULL: "is on a full disk",
}


def _never() -> bool:
    return False


@dataclass(frozen=True)
class Waiting:
    """How a process waits out its storage: for how long from the first failure (--storage-patience), how it says so
    (a search's notes; a warning in the log by default), and what ends a wait at its next try (a signal)."""

    limit_s: float = DEFAULT_PATIENCE_S
    say: Callable[[str], None] = log.warning
    interrupted: Callable[[], bool] = _never


DEFAULT_WAITING = Waiting()


@dataclass(frozen=True)
class Problem:
    cause: str  # UNREACHABLE, LOCKED or FULL
    detail: str  # the driver's first line, or which processes have a locked SQLite file open


class Patience:
    """Retries storage calls through an outage, and says when one starts, ends, or lasts too long.

    `say` prints a line (the search's notes); `interrupted` tells whether a signal asks the process to stop: the
    wait ends at its next try (10 s at most), not at the limit. Shared by the threads of one process: one outage,
    one pair of lines.
    """

    def __init__(
        self,
        limit_s: float,
        where: str,
        say: Callable[[str], None] = log.warning,
        sqlite_file: Path | None = None,
    ) -> None:
        self.limit_s = limit_s
        self.where = where  # the storage URL, its password redacted
        self.say = say
        self.sqlite_file = sqlite_file
        self.interrupted: Callable[[], bool] = lambda: False
        self.lock = threading.Lock()
        self.outage_since: float | None = None

    def call(self, attempt: Callable[[], Result]) -> Result:
        """`attempt()`, retried while the storage is unreachable, locked or full, up to the limit."""
        wait_s = FIRST_WAIT_S
        while True:
            try:
                value = attempt()
            except Exception as error:
                problem = storage_problem(error, self.sqlite_file)
                if problem is None:
                    raise
                self._wait(problem, wait_s)
                wait_s = min(2 * wait_s, LONGEST_WAIT_S)
                continue
            self._recovered()
            return value

    def _wait(self, problem: Problem, wait_s: float) -> None:
        with self.lock:
            first = self.outage_since is None
            if first:
                self.outage_since = time.monotonic()
            since = self.outage_since
        if first:
            self.say(
                f"storage {self.where} {_WORDS[problem.cause]} ({problem.detail}); "
                f"retrying for up to {format_duration(self.limit_s)} (--storage-patience)"
            )
        waited = time.monotonic() - since
        if waited >= self.limit_s or self.interrupted():
            self._give_up(problem, waited)
        time.sleep(min(wait_s, max(0.0, self.limit_s - waited)))

    def _give_up(self, problem: Problem, waited: float) -> None:
        with self.lock:
            self.outage_since = None
        why = "stopped by a signal" if self.interrupted() else "gave up"
        raise StorageUnavailableError(
            f"storage {self.where} {_WORDS[problem.cause]} ({problem.detail}); {why} after "
            f"{format_duration(waited)} (--storage-patience {format_duration(self.limit_s)})"
        )

    def _recovered(self) -> None:
        if self.outage_since is None:  # read without the lock: the common case costs nothing
            return
        with self.lock:
            since, self.outage_since = self.outage_since, None
        if since is not None:
            self.say(f"storage {self.where} answers again, after {format_duration(time.monotonic() - since)}")


def storage_problem(error: BaseException, sqlite_file: Path | None = None) -> Problem | None:
    """The passing problem behind a failed storage call, or None when the call itself is at fault."""
    database_error = _database_error(error)
    if database_error is None:
        return None
    detail = _first_line(database_error.orig if database_error.orig is not None else database_error)
    lowered = detail.lower()
    if "is locked" in lowered:
        return Problem(LOCKED, lock_holders(sqlite_file) if sqlite_file else detail)
    if "disk is full" in lowered or "no space left" in lowered:
        return Problem(FULL, detail)
    from_sqlite = type(database_error.orig).__module__ == "sqlite3"
    if database_error.connection_invalidated or (
        isinstance(database_error, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError))
        and not from_sqlite  # SQLite's other operational errors (no such table, read-only file) do not pass
    ):
        return Problem(UNREACHABLE, detail)
    return None


def _database_error(error: BaseException) -> sqlalchemy.exc.DBAPIError | None:
    """The driver's error behind `error` (Optuna wraps it in StorageInternalError), if there is one."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, sqlalchemy.exc.DBAPIError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def lock_holders(path: Path) -> str:
    """The other processes of this machine that have an SQLite file open, by kind: "optuna-dashboard (pid 4242)".
    One of them holds the lock (SQLite does not say which)."""
    target = path.resolve()
    holders = []
    for process in psutil.process_iter(["pid", "name", "cmdline"]):
        if process.pid == psutil.Process().pid:
            continue
        try:
            files = process.open_files()
        except psutil.Error:
            continue
        if any(Path(file.path) == target for file in files):
            holders.append(f"{_kind(process.info['name'] or '', process.info['cmdline'] or [])} (pid {process.pid})")
    if not holders:
        return f"no other process of this machine has {path} open"
    return f"{path} is open in {', '.join(holders)}"


def _kind(name: str, command: list[str]) -> str:
    """What a process is, as a user knows it: optuna-dashboard, autotune report, the sqlite3 shell, ..."""
    words = [Path(word).name for word in command]
    if any(word.startswith(("optuna-dashboard", "optuna_dashboard")) for word in words):
        return "optuna-dashboard"
    if "autotune" in words:
        following = words[words.index("autotune") + 1 :]
        return f"autotune {following[0]}" if following else "autotune"
    if name == "sqlite3" or (words and words[0] == "sqlite3"):
        return "the sqlite3 shell"
    return name or "a process"


class PatientStorage(RDBStorage):
    """Optuna's RDBStorage whose every call goes through a Patience, except the heartbeat's: a heartbeat that
    fails is simply recorded at the next beat (recovery.Heartbeat), and must not hold up the end of a trial."""

    patience: Patience

    def first_heartbeat(self, trial_id: int) -> None:
        """A trial's first heartbeat, retried through an outage: without one, Optuna never finds the trial stale
        (a trial whose process died would stay RUNNING)."""
        self.patience.call(lambda: self.record_heartbeat(trial_id))

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        """As Optuna's, and safe to retry: a commit whose connection dropped before it was acknowledged may
        have landed, and a trial found in the state asked for was set there by that attempt (or, for a trial
        popped to RUNNING, by another worker: then the claim of the trial decides, see Claims.take_trial)."""
        attempts = 0

        def attempt() -> bool:
            nonlocal attempts
            attempts += 1
            if attempts > 1 and RDBStorage.get_trial(self, trial_id).state == state:
                return True
            return RDBStorage.set_trial_state_values(self, trial_id, state, values)

        return self.patience.call(attempt)


def _patiently(name: str) -> Callable[..., Any]:
    unpatient = getattr(RDBStorage, name)

    @functools.wraps(unpatient)
    def call(self: PatientStorage, *args: Any, **kwargs: Any) -> Any:
        return self.patience.call(lambda: unpatient(self, *args, **kwargs))

    return call


# Every call of Optuna's storage API that reaches the database (BaseStorage's own helpers call these), and the
# private ones Optuna's own functions call.
PATIENT_CALLS = (*PRIVATE_STORAGE_CALLS,
    "create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr", "get_study_id_from_name",
    "get_study_name_from_id", "get_study_directions", "get_study_user_attrs", "get_study_system_attrs",
    "get_trial_user_attrs", "get_trial_system_attrs", "get_all_studies", "create_new_trial", "set_trial_param",
    "get_trial_param", "set_trial_intermediate_value", "set_trial_user_attr", "set_trial_system_attr",
    "get_trial_id_from_study_id_trial_number", "get_trial", "get_all_trials", "get_best_trial",
)  # fmt: skip
for _name in PATIENT_CALLS:
    setattr(PatientStorage, _name, _patiently(_name))
