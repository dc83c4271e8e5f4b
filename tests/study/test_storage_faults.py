"""The storage failing under a study (autotune.study.patience): a real PostgreSQL server stopped and started
again, an SQLite file held locked by another process, a full disk. No trial process runs here; the searches and
workers that live through the same faults are in tests/e2e/test_storage_e2e.py.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune import study as studies
from autotune.errors import StorageUnavailableError
from autotune.extras import installed
from autotune.study.claims import Claims
from autotune.study.patience import _kind
from tests.disks import fill, small_disk
from tests.postgres import PostgresServer, postgres_server  # noqa: F401 - a fixture


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


def test_a_storage_call_waits_out_a_postgresql_restart(postgres_server: PostgresServer):  # noqa: F811
    said = Said("cannot reach its database")
    storage = studies.open_storage(postgres_server.url, patience_s=300, say=said)
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
    storage = studies.open_storage(postgres_server.url, patience_s=2, say=lambda line: None)
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
    storage = studies.open_storage(postgres_server.url, patience_s=600, say=said)
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
    storage = studies.open_storage(f"sqlite:///{path}", patience_s=2, say=lambda line: None)
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
        storage = studies.open_storage(url, patience_s=2, say=lambda line: None)
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
