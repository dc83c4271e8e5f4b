"""The requests a study replays (--traffic), kept with it once, as an artifact of the study itself (never a copy per
trial): a worker on another machine, or a search resumed where the file is not, fetches them into its cache."""

from __future__ import annotations

import hashlib
import logging
import tempfile
from pathlib import Path
from typing import Any

import optuna
from optuna.artifacts import download_artifact, get_all_artifact_meta

from autotune.errors import StorageUnavailableError, UserError
from autotune.study import artifacts
from autotune.traffic import TrafficRef, read_trace

log = logging.getLogger(__name__)

MIMETYPE = "application/jsonl"


def store_window(store: Any | None, study: optuna.Study, traffic: TrafficRef, cache_dir: Path) -> None:
    """The replayed requests stored with the study, where it has a store and does not hold them yet."""
    if store is None or _artifact_of(study, traffic) is not None:
        return
    artifacts.attach(store, study, traffic.window_path(cache_dir), MIMETYPE)


def fetch_window(
    store: Any | None, study: optuna.Study, traffic: TrafficRef, cache_dir: Path, given: Path | None
) -> None:
    """The study's requests in this machine's cache: there already, read from `given` (the worker's --traffic, which
    must be the same trace), or fetched from the study's artifacts; a UserError saying what to pass otherwise."""
    path = traffic.window_path(cache_dir)
    if given is not None:
        copy = TrafficRef.of(read_trace(given), traffic.requests)
        if copy != traffic:
            raise UserError(
                f"--traffic {given}: its first {traffic.requests} requests are not those study {study.study_name!r} "
                f"replays ({traffic.describe()}); pass that trace, or none"
            )
        copy.keep(cache_dir)
        return
    if path.exists():
        return
    artifact_id = _artifact_of(study, traffic) if store is not None else None
    if artifact_id is None or not _download(store, artifact_id, path):
        raise UserError(
            f"study {study.study_name!r} replays {traffic.describe()}, which is not on this machine and not among the "
            "study's artifacts; pass --traffic with that trace (or --artifacts where the study keeps its files)"
        )


def _artifact_of(study: optuna.Study, traffic: TrafficRef) -> str | None:
    try:
        metas = get_all_artifact_meta(study)
    except StorageUnavailableError:
        raise
    except Exception as error:  # a store or storage that fails: the requests are read from elsewhere or refused
        log.warning("could not list the study's artifacts: %s", error)
        return None
    name = traffic.window_path(Path()).name
    return next((meta.artifact_id for meta in metas if meta.filename == name), None)


def _download(store: Any, artifact_id: str, path: Path) -> bool:
    """The artifact as the window's file, kept only when its checksum is the one it is named by."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as folder:
            partial = Path(folder) / path.name
            download_artifact(artifact_store=store, file_path=str(partial), artifact_id=artifact_id)
            if hashlib.sha256(partial.read_bytes()).hexdigest() != path.stem:
                log.warning("the study's traffic %s is not the requests it is named by: not used", artifact_id)
                return False
            partial.replace(path)
    except Exception as error:  # a lost file, a bucket gone, a full disk
        log.warning("could not fetch the study's traffic %s: %s", artifact_id, error)
        return False
    return True
