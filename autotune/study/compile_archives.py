"""A study's archives of compiled code, stored with the study as Optuna artifacts beside its trial logs.

A trial that compiled anew leaves an archive of what it added to its machine's compile folder (the worker makes and
loads them: autotune/worker/compile_cache.py); it is stored as an artifact of that trial, and its id kept in the
trial's `compile` attribute. Before each trial, every archive of the study not yet on this machine is fetched into the
study's compile folder here, and the trial's worker unpacks those it has not unpacked before. A study warm-started from
another (`--warm-start`) takes the other's archives as its own, as artifacts of the study, so its workers and a resumed
run find them without the other study. Where there is no artifact store (a server database without `--artifacts`)
compiled code stays on the machine that compiled it.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import optuna
from optuna.artifacts import download_artifact, get_all_artifact_meta

from autotune.errors import StorageUnavailableError
from autotune.paths import compile_cache_dir
from autotune.process.results import CompileCacheSpec, TaskResult
from autotune.space import config_key
from autotune.study import artifacts
from autotune.study.records import TrialRecord

log = logging.getLogger(__name__)

ARCHIVE_SUFFIX = ".compile.tar.gz"  # the file name of an archive, in the store as on disk
ARCHIVE_MIMETYPE = "application/gzip"
FETCHED = "archives"  # the folder, in the study's compile folder, of the archives fetched to this machine


class CompileArchives:
    """The archives of one study on this machine: fetched from its artifact store, named in each trial's spec."""

    def __init__(self, store: Any | None, cache_dir: Path, study: optuna.Study, note: Callable[[str], None]) -> None:
        self.store = store
        self.folder = compile_cache_dir(cache_dir, study.study_name)
        self.note = note
        self.adopted = self._study_archives(study)  # archives of the study itself, taken from a warm start
        self.warm_keys: set[str] = set()  # configurations compiled by the study a warm start came from
        self.failed: set[str] = set()  # archives that could not be fetched: said once
        self.taken: list[Path] = []  # a warm start's archives fetched here (this study may have no store to hold them)

    def spec(self, records: Iterable[TrialRecord], archive_to: Path) -> CompileCacheSpec:
        """Where a trial compiles, the archives it loads first (the study's, fetched here), where its own goes."""
        named = {artifact_id: origin for artifact_id, origin in self.adopted.items()}  # a copy: fetched as its origin
        named |= {r.compiled.artifact: r.compiled.artifact for r in records if r.compiled and r.compiled.artifact}
        fetched = [self._fetch(artifact_id, name) for artifact_id, name in named.items()]
        paths = dict.fromkeys([*self.taken, *(path for path in fetched if path is not None)])
        return CompileCacheSpec(str(self.folder), [str(path) for path in paths], str(archive_to))

    def expected_warm(self, records: Iterable[TrialRecord]) -> set[str]:
        """The configurations whose compiled code this study holds (they compiled in it, or in the study it was
        warm-started from): a trial of one is expected to find its graphs in the cache."""
        return self.warm_keys | {config_key(r.config) for r in records if r.compiled and r.compiled.compiled}

    def store_archive(self, trial: optuna.Trial, result: TaskResult) -> None:
        """A trial's archive, stored as its artifact (its id in the figures the trial's attribute keeps)."""
        compiled = result.details.compile
        if compiled is None or compiled.archive is None:
            return
        compiled.artifact = artifacts.attach(self.store, trial, Path(compiled.archive), ARCHIVE_MIMETYPE)

    def adopt(self, study: optuna.Study, source: optuna.Study, source_store: Any | None) -> int:
        """Take the archives of the study a warm start comes from: fetched to this machine, and stored as this study's
        own where it has a store; how many it did not hold yet."""
        records = [TrialRecord.from_frozen(trial) for trial in source.get_trials(deepcopy=False)]
        self.warm_keys |= {config_key(r.config) for r in records if r.compiled and r.compiled.compiled}
        theirs = [r.compiled.artifact for r in records if r.compiled and r.compiled.artifact]
        theirs += list(self._study_archives(source))
        added = 0
        for artifact_id in dict.fromkeys(theirs):
            if artifact_id in self.adopted.values():
                continue
            path = self._fetch(artifact_id, artifact_id, source_store)
            if path is None:
                continue
            self.taken.append(path)
            added += 1
            artifacts.attach(self.store, study, path, ARCHIVE_MIMETYPE)
        self.adopted = self._study_archives(study)
        return added

    def _study_archives(self, study: optuna.Study) -> dict[str, str]:
        """The archives stored as artifacts of the study itself -> the archive each was copied from."""
        try:
            metas = get_all_artifact_meta(study)
        except StorageUnavailableError:
            raise
        except Exception as error:  # as artifacts.attach: a store or storage that fails costs the archives only
            log.warning("could not list the study's archives of compiled code: %s", error)
            return {}
        found = (meta for meta in metas if meta.filename.endswith(ARCHIVE_SUFFIX))
        return {meta.artifact_id: meta.filename.removesuffix(ARCHIVE_SUFFIX) for meta in found}

    def _fetch(self, artifact_id: str, name: str, store: Any | None = None) -> Path | None:
        """The archive as a file of this machine (`name` and the suffix), fetched once; None where it cannot be."""
        path = self.folder / FETCHED / f"{name}{ARCHIVE_SUFFIX}"
        store = store or self.store
        if path.exists() or store is None:
            return path if path.exists() else None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=path.parent) as folder:
                partial = Path(folder) / path.name
                download_artifact(artifact_store=store, file_path=str(partial), artifact_id=artifact_id)
                partial.replace(path)
        except Exception as error:  # a lost file, a bucket gone, a full disk: the trial compiles without it
            if artifact_id not in self.failed:
                self.failed.add(artifact_id)
                self.note(f"archive of compiled code {artifact_id} not fetched ({error}); compiling without it")
            return None
        return path
