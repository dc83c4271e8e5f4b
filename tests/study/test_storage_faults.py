"""The storage failing under a study (autotune.study.patience): a real PostgreSQL server stopped and started
again, shutting down as it is opened, not accepting connections yet, out of connections; an SQLite file held locked
by another process, a full disk; and what no wait can fix, refused at once. No trial process runs here; the searches
and workers that live through the same faults are in tests/e2e/test_storage_e2e.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune import for_tests
from autotune import study as studies
from autotune.errors import StorageUnavailableError, UserError
from autotune.extras import installed
from autotune.space import config_key
from autotune.study import kept
from autotune.study.claims import Claims
from autotune.study.optuna_internals import trial_id
from autotune.study.patience import _kind
from autotune.study.recovery import Recovery
from autotune.testing import moments
from tests.disks import fill, small_disk
from tests.fakes import BASELINE, CONTINUOUS, REFERENCE, settings
from tests.postgres import PostgresServer, postgres_server  # noqa: F401 - a fixture
from tests.study.test_kept import kept_by_a_process_that_died
from tests.study.test_kept import measured as measured_result
from tests.study.test_recovery import dead_owner, retries_of

OUTAGE = "cannot reach its database"


class Said:
    """The lines a Patience prints, with an event for the first one that contains some words."""

    def __init__(self, waited_for: str) -> None:
        self.lines: list[str] = []
        self.waited_for = waited_for
        self.seen = threading.Event()

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if self.waited_for in line:
            self.seen.set()


class InThread:
    """A call made on a thread of its own, so that the test can act while it waits; its result, or its error."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.call = call
        self.outcome: dict[str, object] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.outcome["value"] = self.call()
        except BaseException as error:  # handed to the test
            self.outcome["error"] = error

    def result(self, timeout_s: float = 120) -> object:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the call never ended"
        if "error" in self.outcome:
            raise self.outcome["error"]  # type: ignore[misc]
        return self.outcome["value"]


def opening(url: str, said: Said, limit_s: float = 300) -> InThread:
    """open_storage(url) on a thread: it waits out an outage for up to `limit_s`, saying so in `said`."""
    return InThread(lambda: studies.open_storage(url, studies.Waiting(limit_s, said)))


def test_opening_waits_out_a_server_that_shuts_down_under_it_and_stays_down_then_gives_up_past_its_patience(
    postgres_server: PostgresServer,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    url = postgres_server.url
    monkeypatch.setenv(for_tests.HOLD_VARIABLE, json.dumps({"open": str(tmp_path / "open")}))
    monkeypatch.setattr(moments, "_held", set())
    said = Said(OUTAGE)
    opened = opening(url, said)
    wait_for_file(tmp_path / "open.reached", opened)  # its first connection made, no statement run on it yet
    postgres_server.stop()  # as maintenance does: the connection is terminated under it
    (tmp_path / "open.release").touch()
    assert said.seen.wait(timeout=120), said.lines
    postgres_server.start()
    storage = opened.result()
    optuna.create_study(study_name="opened", storage=storage)  # opened whole: its tables, its connections
    first, last = said.lines
    assert first.startswith(f"storage {studies.redact(url)} {OUTAGE} (terminating connection due to administrator")
    assert first.endswith("retrying for up to 5m00s (--storage-patience)")
    assert last.startswith(f"storage {studies.redact(url)} answers again, after ")

    postgres_server.stop()
    with pytest.raises(StorageUnavailableError) as stopped:
        studies.open_storage(url, studies.Waiting(1, lambda line: None))
    message = str(stopped.value)
    assert message.startswith(f"storage {studies.redact(url)} {OUTAGE} (") and "Connection refused" in message
    assert "\n" not in message and message.endswith("(--storage-patience 1.0s)") and "gave up after 1." in message


def test_opening_waits_out_a_server_with_no_connection_left_and_one_not_accepting_connections_yet(
    postgres_server: PostgresServer,  # noqa: F811
):
    postgres_server.sql("CREATE ROLE limited LOGIN CONNECTION LIMIT 0")
    postgres_server.sql("GRANT CREATE ON SCHEMA public TO limited")
    limited = postgres_server.url.replace("autotune@", "limited@")
    said = Said(OUTAGE)
    opened = opening(limited, said)
    assert said.seen.wait(timeout=120), said.lines
    postgres_server.sql("ALTER ROLE limited CONNECTION LIMIT -1")  # a connection is free again
    opened.result()
    assert 'too many connections for role "limited"' in said.lines[0]
    assert said.lines[1].startswith(f"storage {studies.redact(limited)} answers again, after ")

    postgres_server.stop()
    postgres_server.start(standby=True)  # a replica that a failover is about to promote
    said = Said(OUTAGE)
    opened = opening(postgres_server.url, said)
    assert said.seen.wait(timeout=120), said.lines
    postgres_server.promote()
    optuna.create_study(study_name="after-failover", storage=opened.result())
    assert "the database system is not accepting connections" in said.lines[0]


def test_what_no_wait_can_fix_is_one_line_at_once(postgres_server: PostgresServer):  # noqa: F811
    postgres_server.sql("CREATE ROLE guarded LOGIN PASSWORD 'right'")
    postgres_server.sql("GRANT CREATE ON SCHEMA public TO guarded")
    hba = postgres_server.data / "pg_hba.conf"
    hba.write_text(f"host all guarded 127.0.0.1/32 scram-sha-256\n{hba.read_text()}")
    postgres_server.sql("SELECT pg_reload_conf()")
    server = f"127.0.0.1:{postgres_server.port}"
    refusals = {
        "postgresql+psycopg://autotune@127.0.0.1:no-port/studies": "invalid literal for int() with base 10: 'no-port'",
        "mysql+pymysql://autotune@127.0.0.1/studies": "Failed to import DB access module",  # not installed here
        f"postgresql+psycopg://guarded:wrong@{server}/studies": 'password authentication failed for user "guarded"',
        f"postgresql+psycopg://guarded@{server}/studies": "no password supplied",
        f"postgresql+psycopg://nobody@{server}/studies": 'role "nobody" does not exist',
        f"postgresql+psycopg://autotune@{server}/elsewhere": 'database "elsewhere" does not exist',
    }
    if resolver_answers():
        refusals[f"postgresql+psycopg://autotune@no-such-host.invalid:{postgres_server.port}/studies"] = (
            "no-such-host.invalid"
        )
    for url, words in refusals.items():
        said = Said(OUTAGE)
        with pytest.raises(UserError) as refused:
            studies.open_storage(url, studies.Waiting(5, said))
        message = str(refused.value)
        assert said.lines == [], f"{url} was waited for: {said.lines}"
        assert message.startswith(f"cannot open storage {studies.redact(url)}: ") and words in message, message
        assert message.endswith("; check --storage") and "\n" not in message and "wrong" not in message
    studies.open_storage(f"postgresql+psycopg://guarded:right@{server}/studies")  # the server let in who it may


def resolver_answers() -> bool:
    """Whether this machine's resolver says that a name does not exist (without a name server, it cannot say)."""
    try:
        socket.getaddrinfo("no-such-host.invalid", None)  # .invalid never resolves (RFC 6761)
    except socket.gaierror as error:
        return error.errno != socket.EAI_AGAIN
    return False


def wait_for_file(path: Path, waiting: InThread, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline and waiting.thread.is_alive(), f"{path} never came: {waiting.outcome}"
        time.sleep(0.05)


def test_recovery_waits_out_an_outage_then_stores_the_kept_result_and_retries_the_dead_trial_once(
    postgres_server: PostgresServer,  # noqa: F811
    tmp_path: Path,
):
    url = postgres_server.url
    said = Said(OUTAGE)
    storage = studies.open_storage(url, studies.Waiting(300, said))
    study = studies.create_study(storage, "fake", settings(), seed=0)
    claims = Claims(storage.engine, storage.get_study_id_from_name("fake"), storage.patience)
    died = running_trial(study, claims, BASELINE)  # its process died as it measured: failed and retried once
    measured = running_trial(study, claims, REFERENCE)  # its process died with its result kept on disk
    kept_by_a_process_that_died(tmp_path, study, measured, url)
    storing = running_trial(study, claims, CONTINUOUS)  # its result kept by a process that stores it now: spared
    stored_by_us = kept.keep(tmp_path / f"trial-{storing:04d}", optuna.Trial(study, trial_id(study.trials[storing])),
                             measured_result(), 7.5)  # fmt: skip

    postgres_server.stop()  # as the next worker recovers what those processes left
    notes: list[str] = []
    recovery = Recovery(study, claims, tmp_path, lambda storage, trial_id, number: None, notes.append)
    recovered = InThread(recovery)
    assert said.seen.wait(timeout=120), said.lines
    postgres_server.start()
    recovered.result()

    stored, retried = notes
    assert stored.startswith(f"trial #{measured}: the result its process (pid ") and stored.endswith("is stored")
    assert retried == f"trials #{died} were interrupted when their process died; each is retried once"
    trials = optuna.load_study(study_name="fake", storage=url).get_trials(deepcopy=False)
    assert trials[measured].state == TrialState.COMPLETE and trials[measured].user_attrs["duration_s"] == 7.5
    assert trials[died].state == TrialState.FAIL
    (retry,) = retries_of(study, died)
    assert retry.state == TrialState.WAITING and retry.user_attrs["config"] == BASELINE
    assert claims.holder(config_key(BASELINE)) is None and claims.holder(config_key(REFERENCE)) == measured
    assert trials[storing].state == TrialState.RUNNING and not retries_of(study, storing)  # left to its process
    assert list(tmp_path.glob(f"trial-*/{kept.KEPT_NAME}*")) == [stored_by_us]
    recovery()  # again: nothing more to store or to retry
    assert notes == [stored, retried] and len(retries_of(study, died)) == 1


def running_trial(study: optuna.Study, claims: Claims, config: dict) -> int:
    """A trial as a search runs it, claimed, whose owner is a process that has exited; its number."""
    trial = study.ask()
    trial.set_user_attr("config", config)
    trial.set_user_attr("config_key", config_key(config))
    trial.set_user_attr("owner", dead_owner())
    claims.claim(config_key(config), trial.number)
    return trial.number


def test_a_storage_call_waits_out_a_postgresql_restart(postgres_server: PostgresServer):  # noqa: F811
    said = Said("cannot reach its database")
    storage = studies.open_storage(postgres_server.url, studies.Waiting(300, said))
    study = optuna.create_study(study_name="restarted", storage=storage)
    trial = study.ask()
    postgres_server.stop()  # as maintenance does: every connection of the pool is closed under it
    writer = threading.Thread(target=trial.set_user_attr, args=("measured", 42.0))
    writer.start()
    assert said.seen.wait(timeout=120), said.lines  # the write failed, and waits
    postgres_server.start()
    writer.join(timeout=120)
    assert not writer.is_alive(), "the write never went through once the server was back"
    assert said.lines[0].startswith(f"storage {studies.redact(postgres_server.url)} cannot reach its database (")
    assert said.lines[0].endswith("retrying for up to 5m00s (--storage-patience)")
    assert said.lines[1].startswith(f"storage {studies.redact(postgres_server.url)} answers again, after ")
    study.tell(trial, 1.0)  # the connections the restart dropped were replaced
    assert optuna.load_study(study_name="restarted", storage=postgres_server.url).trials[0].user_attrs == {
        "measured": 42.0
    }


def test_a_postgresql_server_down_past_the_patience_stops_the_call_with_one_line(postgres_server):  # noqa: F811
    storage = studies.open_storage(postgres_server.url, studies.Waiting(2, lambda line: None))
    study = optuna.create_study(study_name="down", storage=storage)
    postgres_server.stop()
    with pytest.raises(StorageUnavailableError) as stopped:
        study.ask()
    message = str(stopped.value)
    assert message.startswith(f"storage {studies.redact(postgres_server.url)} cannot reach its database (")
    assert "\n" not in message and message.endswith("(--storage-patience 2.0s)") and "gave up after 2." in message


def test_a_signal_ends_a_wait_for_the_storage_at_its_next_try(postgres_server):  # noqa: F811
    from autotune.search import interrupts

    said = Said("cannot reach its database")
    storage = studies.open_storage(postgres_server.url, studies.Waiting(600, said))
    storage.patience.interrupted = interrupts.signalled  # as a search's or a worker's storage (search/session.py)
    study = optuna.create_study(study_name="signalled", storage=storage)
    trial = study.ask()
    postgres_server.stop()
    saved = {signum: signal.getsignal(signum) for signum in interrupts.HANDLED}
    interrupts.install()
    try:
        sender = threading.Thread(target=lambda: said.seen.wait(120) and os.kill(os.getpid(), signal.SIGTERM))
        sender.start()
        with pytest.raises(StorageUnavailableError) as stopped, interrupts.deferred():  # as a trial's result is told
            trial.set_user_attr("measured", 42.0)
        sender.join()
        assert "; stopped by a signal after " in str(stopped.value)  # seconds, not the 10 minutes of patience
        assert interrupts.pending_exit_status() == 143  # what the CLI exits with, not 75
    finally:
        interrupts.install()  # forget the signal
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def test_postgresql_as_users_write_it_takes_the_driver_installed_here(postgres_server):  # noqa: F811
    assert installed("psycopg") and not installed("psycopg2")  # the postgres extra: psycopg 3 only
    plain = postgres_server.url.replace("postgresql+psycopg://", "postgresql://")
    storage = studies.open_storage(plain)
    assert storage.engine.dialect.driver == "psycopg"
    optuna.create_study(study_name="plain", storage=storage)
    assert studies.studies_named(["pla*"], plain) == [("plain", plain)]


HOLD_A_READ = """
import sqlite3, sys, time
from pathlib import Path
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN")
connection.execute("SELECT count(*) FROM trials").fetchall()  # a read transaction: SQLite's shared lock, held
Path(sys.argv[2]).touch()
while not Path(sys.argv[3]).exists():
    time.sleep(0.05)
connection.execute("COMMIT")
"""


def test_an_sqlite_file_a_reader_holds_too_long_stops_writes_with_a_line_naming_the_reader(tmp_path):
    path = tmp_path / "held.db"
    storage = studies.open_storage(f"sqlite:///{path}", studies.Waiting(2, lambda line: None))
    study = optuna.create_study(study_name="held", storage=storage)
    trial = study.ask()
    holding, release = tmp_path / "holding", tmp_path / "release"
    reader = subprocess.Popen([sys.executable, "-c", HOLD_A_READ, str(path), str(holding), str(release)])
    try:
        while not holding.exists():
            assert reader.poll() is None, "the reader ended before it held its read"
            time.sleep(0.05)
        with pytest.raises(StorageUnavailableError) as stopped:
            study.tell(trial, 1.0)
        assert f"is open in {_kind(Path(sys.executable).name, [sys.executable, '-c'])} (pid {reader.pid})" in str(
            stopped.value
        )
        assert str(stopped.value).startswith(f"storage sqlite:///{path} is locked by another process (")
        with pytest.raises(StorageUnavailableError, match="is locked by another process"):
            Claims(storage.engine, storage.get_study_id_from_name("held"), storage.patience)  # creates its table
    finally:
        release.touch()
        reader.wait(timeout=60)
    study.tell(trial, 1.0)  # once the reader lets go, the same write goes through
    assert study.trials[0].state == TrialState.COMPLETE
    Claims(storage.engine, storage.get_study_id_from_name("held"), storage.patience)


HOLD_EXCLUSIVE = """
import sqlite3, sys, time
from pathlib import Path
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN EXCLUSIVE")  # no other connection reads the file, nor writes it
Path(sys.argv[2]).touch()
while not Path(sys.argv[3]).exists():
    time.sleep(0.05)
connection.execute("COMMIT")
"""


def test_opening_an_sqlite_file_another_process_holds_locked_waits_names_it_and_opens_once_released(tmp_path):
    path = tmp_path / "held.db"
    url = f"sqlite:///{path}"
    studies.open_storage(url).engine.dispose()  # a study's file, with Optuna's tables
    holding, release = tmp_path / "holding", tmp_path / "release"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_EXCLUSIVE, str(path), str(holding), str(release)])
    try:
        while not holding.exists():
            assert holder.poll() is None, "the holder ended before it held its lock"
            time.sleep(0.05)
        said = Said("is locked by another process")
        opened = opening(url, said, limit_s=5)  # SQLite itself waits for the lock this long at each try
        assert said.seen.wait(timeout=120), said.lines
    finally:
        release.touch()
        holder.wait(timeout=60)
    optuna.create_study(study_name="held", storage=opened.result())
    holder_kind = _kind(Path(sys.executable).name, [sys.executable, "-c"])
    assert said.lines[0] == (
        f"storage {url} is locked by another process ({path} is open in {holder_kind} (pid {holder.pid})); "
        "retrying for up to 5.0s (--storage-patience)"
    )
    assert said.lines[1].startswith(f"storage {url} answers again, after ")


def test_opening_a_new_sqlite_study_on_a_full_disk_waits_then_stops_with_one_line_or_opens_once_there_is_room(
    tmp_path,
):
    with small_disk(tmp_path / "disk", size="1m") as disk:
        url = f"sqlite:///{disk / 'new.db'}"
        filler = fill(disk)
        with pytest.raises(StorageUnavailableError) as stopped:
            studies.open_storage(url, studies.Waiting(1, lambda line: None))
        assert str(stopped.value).startswith(f"storage {url} is on a full disk (database or disk is full); gave up")
        said = Said("is on a full disk")
        opened = opening(url, said)
        assert said.seen.wait(timeout=120), said.lines
        filler.unlink()
        optuna.create_study(study_name="new", storage=opened.result())
        assert said.lines[1].startswith(f"storage {url} answers again, after ")


@pytest.mark.parametrize(
    ("command", "kind"),
    [
        (["/venv/bin/python", "/venv/bin/optuna-dashboard", "sqlite:///studies/x.db"], "optuna-dashboard"),
        (["/venv/bin/python", "-m", "autotune", "report", "--study", "x"], "autotune report"),
        (["/venv/bin/python", "/venv/bin/autotune", "search", "--model", "demo"], "autotune search"),
        (["sqlite3", "studies/x.db"], "the sqlite3 shell"),
        (["/usr/bin/python3", "notebook.py"], "python3"),
    ],
)
def test_a_lock_holder_is_named_as_users_know_it(command, kind):
    assert _kind(Path(command[0]).name, command) == kind


def test_a_full_disk_stops_sqlite_writes_with_a_line_and_damages_nothing_stored(tmp_path):
    with small_disk(tmp_path / "disk", size="2m") as disk:
        url = f"sqlite:///{disk / 'full.db'}"
        storage = studies.open_storage(url, studies.Waiting(2, lambda line: None))
        study = optuna.create_study(study_name="full", storage=storage)
        stored = study.ask()
        stored.set_user_attr("measured", 42.0)
        study.tell(stored, 1.0)
        running = study.ask()
        filler = fill(disk)
        with pytest.raises(StorageUnavailableError) as stopped:
            running.set_user_attr("log", "x" * 1_000_000)  # new pages, on a disk with none left
        assert str(stopped.value).startswith(f"storage {url} is on a full disk (database or disk is full); gave up")
        check = sqlite3.connect(disk / "full.db")
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        check.close()
        filler.unlink()  # room again: the study goes on where it was
        reopened = optuna.load_study(study_name="full", storage=studies.open_storage(url))
        assert reopened.trials[0].user_attrs == {"measured": 42.0} and reopened.trials[0].value == 1.0
        running.set_user_attr("log", "x" * 1_000_000)
        study.tell(running, 2.0)
