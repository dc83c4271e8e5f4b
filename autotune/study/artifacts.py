"""Trial logs and reports as Optuna artifacts, so `optuna-dashboard --artifact-dir` shows why a trial failed.

The store is a folder beside the SQLite file by default (`studies/<study>.db` -> `studies/<study>.artifacts`);
`--artifacts` names a folder, `s3://BUCKET` or `gs://BUCKET` for storage that several machines share.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import optuna
from optuna.artifacts import FileSystemArtifactStore, upload_artifact

from autotune.errors import StorageUnavailableError, UserError
from autotune.study import load_stored_study
from autotune.study.patience import DEFAULT_WAITING, Waiting

log = logging.getLogger(__name__)

LOG_MIMETYPE = "text/plain"
CLOUD_STORES = {"s3://": ("boto3", "Boto3ArtifactStore"), "gs://": ("google.cloud.storage", "GCSArtifactStore")}


def default_location(storage_url: str) -> str | None:
    """The folder beside an SQLite file; None for a server database (name one with --artifacts)."""
    if not storage_url.startswith("sqlite:///"):
        return None
    return str(Path(storage_url.removeprefix("sqlite:///")).with_suffix(".artifacts"))


def open_store(location: str | None, storage_url: str) -> Any | None:
    """The artifact store at `location` (default: beside the SQLite file), or None where there is none."""
    location = check_location(location, storage_url)
    if location is None:
        return None
    for prefix, (module, class_name) in CLOUD_STORES.items():
        if location.startswith(prefix):
            return _cloud_store(location, prefix, module, class_name)
    Path(location).mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(location)


def check_location(location: str | None, storage_url: str) -> str | None:
    """The store's location, checked without writing anything (bad input is one line, exit status 2)."""
    location = location or default_location(storage_url)
    if location is None:
        return None
    for prefix, (module, _) in CLOUD_STORES.items():
        if location.startswith(prefix):
            _check_bucket(location, prefix, module)
            return location
    if Path(location).exists() and not Path(location).is_dir():
        raise UserError(f"--artifacts {location}: is a file, not a folder; name a folder, s3://BUCKET or gs://BUCKET")
    return location


def _check_bucket(location: str, prefix: str, module: str) -> None:
    bucket = location.removeprefix(prefix).strip("/")
    if not bucket or "/" in bucket:
        raise UserError(f"--artifacts {location}: name a bucket only, like {prefix}my-bucket")
    try:
        __import__(module)
    except ImportError:
        raise UserError(f"--artifacts {location}: needs the {module.split('.')[0]} package; pip install it") from None


def _cloud_store(location: str, prefix: str, module: str, class_name: str) -> Any:
    return getattr(optuna.artifacts, class_name)(location.removeprefix(prefix).strip("/"))


def attach(
    store: Any | None, target: optuna.Trial | optuna.Study, path: Path, mimetype: str | None = None
) -> str | None:
    """Upload one file to a trial or a study; its artifact id, or None when there is no store or no file.

    A store that fails (a full disk, a lost bucket) costs the artifact, never the trial: it is logged. A study
    storage that stays unreachable past its patience stops the process as any storage call does.
    """
    if store is None or not path.is_file():
        return None
    try:
        return upload_artifact(artifact_store=store, file_path=str(path), study_or_trial=target, mimetype=mimetype)
    except StorageUnavailableError:
        raise
    except Exception as error:  # boto3, GCS and the file system raise their own kinds
        log.warning("could not store %s as an artifact: %s", path, error)
        return None


def attach_to_trial_id(store: Any | None, storage: optuna.storages.BaseStorage, trial_id: int, path: Path) -> None:
    """Upload a file to a trial known by its id only (a trial another process left running)."""
    if store is None or not path.is_file():
        return
    trial = storage.get_trial(trial_id)
    try:
        upload_artifact(
            artifact_store=store, file_path=str(path), study_or_trial=trial, storage=storage, mimetype=LOG_MIMETYPE
        )
    except StorageUnavailableError:
        raise
    except Exception as error:  # as in attach
        log.warning("could not store %s as an artifact: %s", path, error)


def attach_report(
    study_name: str, storage_url: str, location: str | None, report: Path, waiting: Waiting = DEFAULT_WAITING
) -> str | None:
    """Store the HTML report with the study; where the artifacts are, or None where there is no store."""
    where = location or default_location(storage_url)
    store = open_store(location, storage_url)
    if store is None:
        return None
    attach(store, load_stored_study(storage_url, study_name, waiting), report, "text/html")
    return where
