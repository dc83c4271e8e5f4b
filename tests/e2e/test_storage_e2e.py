"""The study survives its database: real `autotune worker` processes on a real PostgreSQL server that is stopped
while their trials measure and started again, a worker that outlasts its --storage-patience, a search and a worker
whose server is stopped at each moment of their lives (held there by autotune/testing/moments.py), `best`, `report` and
`history` whose server is stopped as they read, and a search beside a reader holding its SQLite file. The demo model;
each wait is on an event (a line printed, a file, a process ending), never on a fixed sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import optuna
import psutil
import pytest

from autotune import study as studies
from autotune.extras import installed
from autotune.study import records
from autotune.study.kept import KEPT_NAME
from autotune.worker.demo_model import ensure_demo_model
from tests.conftest import BRIEF, EIGHT_CONFIGURATIONS, announced, cheap_space
from tests.disks import fill, small_disk
from tests.postgres import PostgresServer, postgres_server  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow

SMALL = ["--batch-size", "2", "--input-len", "32", "--output-len", "16", *BRIEF]
OUTAGE = "cannot reach its database"


@pytest.fixture
def env(cache_dir: Path) -> dict[str, str]:
    ensure_demo_model(cache_dir)
    return {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache_dir)}


class Watched:
    """A process whose output lines are read as they come, so a test can wait for one."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)  # fmt: skip
        self.lines: list[str] = []
        self.errors: list[str] = []
        self.arrived = threading.Condition()
        streams = ((self.process.stdout, self.lines), (self.process.stderr, self.errors))
        self.readers = [threading.Thread(target=self._read, args=pair, daemon=True) for pair in streams]
        for reader in self.readers:
            reader.start()

    def _read(self, stream: IO[str], kept: list[str]) -> None:
        for line in stream:
            with self.arrived:
                kept.append(line.rstrip("\n"))
                self.arrived.notify_all()
        with self.arrived:
            self.arrived.notify_all()

    def wait_for_line(self, words: str, timeout_s: float = 600) -> str:
        """The first line of its output with `words`, once printed; fails if the process ends without one."""
        with self.arrived:
            found = self.arrived.wait_for(lambda: self._found(words) or not self.readers[0].is_alive(), timeout_s)
            assert found and self._found(words), f"no line with {words!r}: {self.output()}"
            return self._found(words)[0]

    def _found(self, words: str) -> list[str]:
        return [line for line in self.lines if words in line]

    def said(self, words: str) -> list[str]:
        """Its lines, on stdout or stderr, with `words`."""
        return [line for line in [*self.lines, *self.errors] if words in line]

    def wait_until_said(self, words: str, times: int, timeout_s: float = 300) -> None:
        """Until `times` of its lines have `words`; fails if it ends before."""
        with self.arrived:
            enough = lambda: len(self.said(words)) >= times  # noqa: E731
            found = self.arrived.wait_for(lambda: enough() or not self.readers[0].is_alive(), timeout_s)
            assert found and enough(), f"not {times} lines with {words!r}: {self.output()}"

    def finish(self, timeout_s: float = 900) -> int:
        code = self.process.wait(timeout=timeout_s)
        for reader in self.readers:
            reader.join(timeout=30)
        return code

    def output(self) -> str:
        return "\n".join([*self.lines, *self.errors])


def worker(name: str, url: str, env: dict[str, str], cwd: Path, *args: str) -> Watched:
    command = [sys.executable, "-m", "autotune", "worker", "--study", name, "--storage", url, "--device", "cpu"]
    return Watched([*command, *args], cwd, env)


def stalled_trials(study: optuna.Study, folder: Path, owners: set[int]) -> dict[int, int]:
    """Trial number -> owner pid of the running trials of `owners` that stall while loading (their worker
    announced it)."""
    running = {}
    for trial in study.get_trials(deepcopy=False):
        owner = trial.user_attrs.get("owner", {}).get("pid")
        if trial.state.name == "RUNNING" and owner in owners and announced(folder, trial.number, "load"):
            running[trial.number] = owner
    return running


@pytest.fixture
def study_name(cache_dir: Path) -> Iterator[str]:
    """A name no other test or run gives a study: a server database's trial files go to the cache, which they share.
    Its trial files are removed after."""
    name = f"outage-{uuid.uuid4().hex[:8]}"
    yield name
    shutil.rmtree(cache_dir / "studies" / name, ignore_errors=True)


def test_workers_live_through_a_postgresql_restart_and_past_their_patience_leave_their_result_for_the_next(
    tmp_path,
    env,
    study_name: str,
    postgres_server: PostgresServer,  # noqa: F811
):
    # As users write the URL, with psycopg 3 only installed (SQLAlchemy's default driver for it is psycopg2).
    assert installed("psycopg") and not installed("psycopg2")
    url = postgres_server.url.replace("postgresql+psycopg://", "postgresql://")
    name = study_name
    (tmp_path / "eight.yaml").write_text(EIGHT_CONFIGURATIONS)  # six trials below: each one measures
    created = subprocess.run([sys.executable, "-m", "autotune", "search", "--model", "demo", "--gpu", "cpu", "--study",
                              name, "--storage", url, "--space", "eight.yaml", "--trials", "1", *SMALL], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert created.returncode == 0, created.stdout + created.stderr

    release = tmp_path / "release-the-stalls"
    stalls = {**env, "AUTOTUNE_INJECT_FAULTS": json.dumps({"0": {"phase": "load", "kind": "stall",
                                                                 "until": str(release)}})}  # fmt: skip
    patient = [worker(name, url, stalls, tmp_path, "--trials", "2") for _ in range(2)]  # the default: 10 minutes
    impatient = worker(name, url, stalls, tmp_path, "--trials", "2", "--storage-patience", "3s")
    workers = [*patient, impatient]
    study = optuna.load_study(study_name=name, storage=postgres_server.url)
    folder = Path(env["AUTOTUNE_CACHE_DIR"]) / "studies" / name
    owners = {w.process.pid for w in workers}
    three = lambda: len(stalled_trials(study, folder, owners)) == 3  # noqa: E731
    for each in workers:
        wait_until(three, each, "not every worker reached its trial")  # every worker mid-trial
    measuring = stalled_trials(study, folder, owners)

    postgres_server.stop()  # as maintenance does, while three trials measure
    release.touch()  # they finish during the outage
    for each in patient:
        assert "retrying for up to 10m00s (--storage-patience)" in each.wait_for_line(OUTAGE)
    assert impatient.finish() == 75, impatient.output()  # past its patience: it stops, its result kept on disk
    postgres_server.start()  # the outage lasted until all three trials had finished and the third worker stopped
    for each in patient:
        assert each.finish() == 0, each.output()  # each stored its trial, then measured another

    (line,) = impatient.errors
    kept_trial = next(number for number, pid in measuring.items() if pid == impatient.process.pid)
    assert line.startswith(f"autotune: storage unavailable: storage {url} {OUTAGE} (connection failed: ")
    assert "gave up after 3." in line and "(--storage-patience 3.0s)" in line
    assert line.endswith(
        f"trial #{kept_trial}'s result is kept in {folder / f'trial-{kept_trial:04d}' / KEPT_NAME}: the next "
        "`autotune worker` or `autotune search` on this study, on this machine, stores it"
    )
    stored_by = [w for w in patient if any(f"trial #{kept_trial}: the result its process" in x for x in w.lines)]
    assert len(stored_by) == 1, "the kept result is stored once, by one of the workers that went on"
    assert all(any("answers again, after " in x for x in w.lines) for w in patient)

    study = optuna.load_study(study_name=name, storage=postgres_server.url)
    states = [t.state.name for t in study.get_trials(deepcopy=False)]
    assert "RUNNING" not in states and "WAITING" not in states, "a trial was left unaccounted for"
    by_number = {r.number: r for r in records(study)}
    for number in measuring:  # the figures of the trials that finished during the outage
        assert by_number[number].complete and by_number[number].metrics["throughput_tok_s"] > 0, by_number[number]
    measured = [json.dumps(r.config, sort_keys=True) for r in by_number.values() if r.launched and r.outcome]
    assert len(measured) == len(set(measured)) == 1 + 2 + 2 + 1, "every configuration measured once, none lost"
    assert not [r for r in by_number.values() if r.interrupted], "no trial was lost to the outage"
    assert list(folder.glob(f"trial-*/{KEPT_NAME}*")) == []


class Holds:
    """The moments a process is held at (autotune/testing/moments.py: AUTOTUNE_HOLD_AT), their files in `folder`."""

    def __init__(self, folder: Path, *moments: str) -> None:
        folder.mkdir(parents=True)
        self.stems = {moment: folder / moment for moment in moments}
        self.released: list[str] = []

    def env(self, env: dict[str, str]) -> dict[str, str]:
        return {**env, "AUTOTUNE_HOLD_AT": json.dumps({moment: str(stem) for moment, stem in self.stems.items()})}

    def reached(self) -> list[str]:
        """The moments the process is held at now."""
        return [m for m, stem in self.stems.items() if Path(f"{stem}.reached").exists() and m not in self.released]

    def release(self, moment: str) -> None:
        Path(f"{self.stems[moment]}.release").touch()
        self.released.append(moment)


ANSWERS = "answers again, after "


def outage_now(server: PostgresServer, held: dict[Watched, Holds]) -> bool:
    """If some processes are held at a moment: stop the server, let them go on into the outage, wait until each says
    it waits, start the server, and wait until each says the storage answers again. Whether any was held."""
    at = {watched: holds.reached() for watched, holds in held.items() if holds.reached()}
    if not at:
        return False
    outages = {watched: len(watched.said(OUTAGE)) for watched in at}  # none under way: each is held
    server.stop()
    for watched, moments in at.items():
        for moment in moments:
            held[watched].release(moment)
    for watched, before in outages.items():
        watched.wait_until_said(OUTAGE, before + 1)
    server.start()
    for watched, before in outages.items():
        watched.wait_until_said(ANSWERS, before + 1)
    return True


def outages_until_they_end(server: PostgresServer, held: dict[Watched, Holds]) -> None:
    """An outage at each moment the processes are held at, until every one of them has ended."""
    while any(watched.process.poll() is None for watched in held):
        if not outage_now(server, held):
            time.sleep(0.1)


def test_a_search_and_a_worker_outlast_an_outage_at_each_moment_of_their_lives_and_the_readers_at_their_read(
    tmp_path,
    env,
    study_name: str,
    postgres_server: PostgresServer,  # noqa: F811
):
    url, name = postgres_server.url, study_name
    release_the_stall = tmp_path / "release-the-stall"
    stall = {"AUTOTUNE_INJECT_FAULTS": json.dumps({"0": {"phase": "load", "kind": "stall",
                                                          "until": str(release_the_stall)}})}  # fmt: skip
    searched = Holds(tmp_path / "search", "open", "study", "ask", "claim", "front", "read", "report")
    command = [sys.executable, "-m", "autotune", "search", "--model", "demo", "--gpu", "cpu", "--study", name,
               "--storage", url, *cheap_space(tmp_path), "--trials", "2", "--artifacts", str(tmp_path / "artifacts"),
               *SMALL]  # fmt: skip
    search = Watched(command, tmp_path, {**searched.env(env), **stall})
    folder = Path(env["AUTOTUNE_CACHE_DIR"]) / "studies" / name
    while not announced(folder, 0, "load"):  # an outage at each moment up to its first trial, which then stalls
        assert search.process.poll() is None, search.output()
        if not outage_now(postgres_server, {search: searched}):
            time.sleep(0.1)

    # The scenario: a worker started while PostgreSQL is stopped, started again once the worker waits for it.
    postgres_server.stop()
    joined = Holds(tmp_path / "worker", "study")
    joining = worker(name, url, joined.env(env), tmp_path, "--trials", "2", "--storage-patience", "2m")
    joining.wait_until_said(OUTAGE, 1)
    release_the_stall.touch()  # and the search's trial ends meanwhile: its result waits to be stored
    search.wait_until_said(OUTAGE, 5)
    postgres_server.start()
    outages_until_they_end(postgres_server, {search: searched, joining: joined})
    assert search.finish() == 0, search.output()
    assert joining.finish() == 0, joining.output()

    both = f"{search.output()}\n{joining.output()}"
    assert searched.released == ["open", "study", "ask", "claim", "front", "read", "report"], both
    assert joined.released == ["study"], both
    assert "(terminating connection due to administrator command" in search.said(OUTAGE)[0], both  # as it opened
    opening = joining.said(OUTAGE)[0]
    assert "Connection refused" in opening and opening.endswith("retrying for up to 2m00s (--storage-patience)"), both
    for each in (search, joining):
        assert len(each.said(OUTAGE)) == len(each.said(ANSWERS)), both  # each outage ended, and was said to
    assert any(line.startswith("trial logs and the report are stored as Optuna artifacts in") for line in search.lines)
    study = optuna.load_study(study_name=name, storage=url)
    states = [t.state.name for t in study.get_trials(deepcopy=False)]
    assert "RUNNING" not in states and "WAITING" not in states, f"a trial was left unaccounted for: {states}\n{both}"
    measured = [r for r in records(study) if r.launched and r.outcome]
    keys = [json.dumps(r.config, sort_keys=True) for r in measured]
    assert len(keys) == len(set(keys)) == 2 + 2 and all(r.complete for r in measured), f"each measured once: {both}"
    assert not [r for r in records(study) if r.interrupted], f"none failed for heartbeats lost to an outage: {both}"
    assert list(folder.glob(f"trial-*/{KEPT_NAME}*")) == []

    readers: dict[Watched, Holds] = {}
    for arguments in (
        ["best", "--study", name, "--format", "json"],
        ["report", "--study", name, "--report", str(tmp_path / "again.html")],
        ["history", "--studies", name, "--format", "json", "--report", str(tmp_path / "nights.html")],
    ):
        holds = Holds(tmp_path / arguments[0], "read")
        command = [sys.executable, "-m", "autotune", *arguments, "--storage", url, "--storage-patience", "2m"]
        readers[Watched(command, tmp_path, holds.env(env))] = holds  # fmt: skip
    for reader, holds in readers.items():  # each has opened the study, and reads it after one outage for all three
        wait_until(holds.reached, reader, "it never read the study")
    outages_until_they_end(postgres_server, readers)
    best, report, history = readers
    outputs = "\n".join(reader.output() for reader in readers)
    assert [reader.finish() for reader in readers] == [0, 0, 0], outputs
    assert json.loads("\n".join(best.lines))["trial"] in {r.number for r in measured}
    assert report.lines == [f"report: {tmp_path / 'again.html'}"] and (tmp_path / "again.html").stat().st_size > 0
    assert [night["study"] for night in json.loads("\n".join(history.lines))["nights"]] == [name]
    for reader in readers:  # on stderr: the output may be JSON
        waited, answered = reader.errors
        assert waited.startswith(f"note: storage {url} {OUTAGE} (") and answered.startswith(
            f"note: storage {url} {ANSWERS}"
        ), outputs

    postgres_server.stop()  # past its patience, a reader stops with one line
    impatient = subprocess.run([sys.executable, "-m", "autotune", "best", "--study", name, "--storage", url,
                                "--storage-patience", "1s"], cwd=tmp_path, env=env, capture_output=True, text=True,
                               timeout=300)  # fmt: skip
    assert impatient.returncode == 75, impatient.stdout + impatient.stderr
    waits, line = impatient.stderr.splitlines()
    assert waits.startswith(f"note: storage {url} {OUTAGE} (") and "Connection refused" in waits
    assert line.startswith(f"autotune: storage unavailable: storage {url} {OUTAGE} (connection failed: ")
    assert line.endswith("(--storage-patience 1.0s)") and impatient.stdout == ""


def test_a_full_disk_fails_the_trials_with_their_reason_and_the_report_with_a_line_and_damages_nothing(tmp_path, env):
    (tmp_path / "eight.yaml").write_text(EIGHT_CONFIGURATIONS)
    search = [sys.executable, "-m", "autotune", "search", "--model", "demo", "--gpu", "cpu", "--space", "eight.yaml",
              *SMALL]  # fmt: skip
    first = subprocess.run([*search, "--trials", "1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=900)  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    url = f"sqlite:///{tmp_path}/studies/demo-cpu.db"
    before = records(optuna.load_study(study_name="demo-cpu", storage=url))
    report = tmp_path / "reports" / "demo-cpu.html"
    written = report.read_bytes()

    release = tmp_path / "release-the-stall"
    stall = {**env, "AUTOTUNE_INJECT_FAULTS": json.dumps({"0": {"phase": "load", "kind": "stall",
                                                                "until": str(release)}})}  # fmt: skip
    with on_a_small_disk(tmp_path / "studies" / "demo-cpu") as trials, on_a_small_disk(tmp_path / "reports") as reports:
        fill(reports)
        resumed = Watched([*search, "--trials", "2"], tmp_path, stall)
        study = optuna.load_study(study_name="demo-cpu", storage=url)
        wait_until(lambda: stalled_trials(study, trials, {resumed.process.pid}), resumed, "no trial stalled")
        trial_files = fill(trials)  # while the first trial runs
        release.touch()
        assert resumed.finish() == 1, resumed.output()
        (line,) = resumed.errors
        assert line == (
            "autotune: reports/demo-cpu.html could not be written: No space left on device; the study is untouched: "
            "`autotune report --study demo-cpu` writes the report again from it"
        )
        assert report.read_bytes() == written  # the previous report, whole
        after = {r.number: r for r in records(optuna.load_study(study_name="demo-cpu", storage=url))}
        stored = [r for r in before if r.state != "WAITING"]
        assert stored and [(r.state, r.metrics) for r in stored] == [(after[r.number].state, after[r.number].metrics)
                                                                     for r in stored]  # fmt: skip
        failed = [r for r in after.values() if r.launched and r.number not in {s.number for s in stored}]
        assert len(failed) == 2 and all(r.state == "FAIL" for r in failed), after
        assert failed[0].message.startswith("no space left on device: 0 B free where the task writes its files")
        assert failed[1].message.startswith("cannot write the task's files in ") and failed[1].message.endswith(
            ": No space left on device"
        )
        check = sqlite3.connect(tmp_path / "studies" / "demo-cpu.db")
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        check.close()
        trial_files.unlink()
        (reports / "filler").unlink()
        again = subprocess.run([sys.executable, "-m", "autotune", "report", "--study", "demo-cpu"], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert again.returncode == 0 and report.read_bytes() != written, again.stdout + again.stderr


@contextlib.contextmanager
def on_a_small_disk(folder: Path) -> Iterator[Path]:
    """`folder`, with what it holds, moved onto a small disk of its own (a tmpfs with room for all of it twice, as a
    report written again beside the last one needs, and 2 MB to spare)."""
    aside = folder.with_name(f"{folder.name}.aside")
    folder.rename(aside)
    size = sum(path.stat().st_size for path in aside.rglob("*") if path.is_file())
    with small_disk(folder, size=f"{2 * size // 1024 + 2048}k") as disk:
        shutil.copytree(aside, disk, dirs_exist_ok=True)
        yield disk


def wait_until(found: Callable[[], object], watched: Watched, failure: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not found():
        assert time.monotonic() < deadline and watched.process.poll() is None, f"{failure}: {watched.output()}"
        time.sleep(0.5)


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


def test_a_search_beside_a_reader_holding_its_sqlite_file_waits_names_the_reader_and_goes_on(tmp_path, env):
    database = tmp_path / "studies" / "demo-cpu.db"
    studies.open_storage(f"sqlite:///{database}").engine.dispose()  # Optuna's tables, no study yet: something to read
    holding, release = tmp_path / "holding", tmp_path / "release"
    reader = subprocess.Popen([sys.executable, "-c", HOLD_A_READ, str(database), str(holding), str(release)])
    try:
        while not holding.exists():
            assert reader.poll() is None, "the reader ended before it held its read"
            time.sleep(0.05)
        holder = psutil.Process(reader.pid).name()
        (tmp_path / "eight.yaml").write_text(EIGHT_CONFIGURATIONS)
        command = ["search", "--model", "demo", "--gpu", "cpu", "--space", "eight.yaml", "--trials", "1", *SMALL]
        search = Watched([sys.executable, "-m", "autotune", *command, "--storage-patience", "10s"], tmp_path, env)
        locked = search.wait_for_line("is locked by another process")
    finally:
        release.touch()  # the reader commits: the search's next try goes through
        reader.wait(timeout=60)
    assert search.finish() == 0, search.output()
    assert locked == (
        "note: storage sqlite:///studies/demo-cpu.db is locked by another process (studies/demo-cpu.db is open in "
        f"{holder} (pid {reader.pid})); retrying for up to 10.0s (--storage-patience)"
    )
    assert any(line.startswith("note: storage sqlite:///studies/demo-cpu.db answers again, after ") for line in
               search.lines)  # fmt: skip
    assert [r.outcome for r in records(optuna.load_study(study_name="demo-cpu", storage=f"sqlite:///{database}"))
            if r.launched] == ["ok"]  # fmt: skip
