"""A study's archives of compiled code on real SQLite studies and a real artifact folder: a trial's stored with it,
fetched once to each machine, a warm start's taken as the study's own, one that cannot be fetched noted once."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.paths import compile_cache_dir
from autotune.process.results import CompileFigures, Outcome, TaskDetails, TaskResult
from autotune.space import config_key
from autotune.study import TrialRecord, artifacts
from autotune.study.compile_archives import ARCHIVE_SUFFIX, CompileArchives
from autotune.study.records import COMPILE_ATTR

COMPILED = {"dtype": "float32", "cache_implementation": "static", "compile": "default"}


class Places:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = artifacts.open_store(str(root / "artifacts"), "sqlite:///unused.db")
        self.notes: list[str] = []

    def study(self, name: str) -> optuna.Study:
        return optuna.create_study(study_name=name, storage=f"sqlite:///{self.root}/studies.db", load_if_exists=True)

    def archives(self, study: optuna.Study, machine: str) -> CompileArchives:
        return CompileArchives(self.store, self.root / machine, study, self.notes.append)


@pytest.fixture
def places(tmp_path: Path) -> Places:
    return Places(tmp_path)


def compiled_trial(study: optuna.Study, archives: CompileArchives, archive: Path) -> None:
    """A trial that compiled `archive`'s code anew, stored as a trial's figures are (records.record_result)."""
    trial = study.ask()
    figures = CompileFigures(graphs=1, missed=1, seconds=20.0, archive=str(archive))
    archives.store_archive(trial, TaskResult(Outcome.OK, details=TaskDetails(compile=figures)))
    trial.set_user_attr("config", COMPILED)
    trial.set_user_attr(COMPILE_ATTR, figures.to_stored())
    study.tell(trial, 1.0)


def records(study: optuna.Study) -> list[TrialRecord]:
    return [TrialRecord.from_frozen(trial) for trial in study.get_trials()]


def an_archive(folder: Path, data: bytes = b"compiled code") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"trial-0002{ARCHIVE_SUFFIX}").write_bytes(data)
    return folder / f"trial-0002{ARCHIVE_SUFFIX}"


def test_a_trials_archive_is_stored_with_it_and_fetched_once_to_another_machine(places: Places, tmp_path: Path):
    study = places.study("night")
    compiled_trial(study, places.archives(study, "first"), an_archive(tmp_path / "trial"))
    stored = records(study)[0].compiled
    assert stored is not None and stored.artifact and stored.cache == "cold" and stored.seconds == 20.0
    other = places.archives(study, "second")
    spec = other.spec(records(study), tmp_path / "next" / "archive")
    assert spec.folder == str(compile_cache_dir(tmp_path / "second", "night"))
    assert [Path(path).read_bytes() for path in spec.archives] == [b"compiled code"]
    (tmp_path / "artifacts" / stored.artifact).unlink()  # fetched already: the store is not read again
    assert other.spec(records(study), tmp_path / "next" / "archive").archives == spec.archives
    assert places.notes == []


def test_an_archive_that_cannot_be_fetched_is_noted_once_and_left_out(places: Places, tmp_path: Path):
    study = places.study("night")
    compiled_trial(study, places.archives(study, "first"), an_archive(tmp_path / "trial"))
    stored = records(study)[0].compiled
    (tmp_path / "artifacts" / stored.artifact).unlink()  # type: ignore[union-attr]
    other = places.archives(study, "second")
    assert other.spec(records(study), tmp_path / "archive").archives == []
    assert other.spec(records(study), tmp_path / "archive").archives == []
    assert len(places.notes) == 1 and "compiling without it" in places.notes[0]


def test_a_warm_start_takes_the_other_studys_archives_as_its_own_once(places: Places, tmp_path: Path):
    last_night = places.study("last-night")
    compiled_trial(last_night, places.archives(last_night, "first"), an_archive(tmp_path / "trial"))
    tonight = places.study("tonight")
    archives = places.archives(tonight, "second")
    assert archives.adopt(tonight, last_night, places.store) == 1
    assert archives.adopt(tonight, last_night, places.store) == 0  # a resumed warm start: held already
    assert archives.expected_warm([]) == {config_key(COMPILED)}
    joining = places.archives(tonight, "third")  # a worker of tonight's study on another machine
    spec = joining.spec([], tmp_path / "archive")
    assert [Path(path).read_bytes() for path in spec.archives] == [b"compiled code"]
    assert places.notes == []


def test_without_a_store_a_warm_start_still_loads_the_other_studys_archives_here(places: Places, tmp_path: Path):
    last_night = places.study("last-night")
    compiled_trial(last_night, places.archives(last_night, "first"), an_archive(tmp_path / "trial"))
    tonight = places.study("tonight")
    archives = CompileArchives(None, tmp_path / "second", tonight, places.notes.append)  # a server, no --artifacts
    assert archives.adopt(tonight, last_night, places.store) == 1
    assert len(archives.spec([], tmp_path / "archive").archives) == 1
