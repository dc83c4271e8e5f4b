"""A measured result kept on local disk until the study's storage has it: through an outage, or past it.

A trial (search/trial.py) writes its result beside its files (`<trial folder>/result-to-store.json`) before it
tells the storage, and removes it once the storage has it. A file still there belongs to a process that could
not finish: it gave up waiting for its storage (--storage-patience) or was killed. The next search or worker of
the study on this machine stores it, before it looks for interrupted trials, and exactly once: a process takes
a file by renaming it to a name of its own (an atomic rename: of two processes, one gets it), and takes one
left by another process only when that process is gone.

The trial may have been failed meanwhile, as interrupted, by another worker whose heartbeat check found it
stale (the outage outlasted the grace period). Optuna lets no finished trial be changed, so the result goes
to the retry that failure queued, while it still waits: that retry is popped and told the result, and the
configuration is measured once. When the retry was taken already, the retry measures the configuration and the
kept result is dropped, with a line that says so: storing it too would measure the configuration twice.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from autotune.process.results import TaskResult, write_json_atomically
from autotune.study import migrations
from autotune.study.claims import OWNER_ATTR, Claims, claim_configuration, owner_alive, this_process
from autotune.study.optuna_internals import study_id, study_storage, trial_id
from autotune.study.records import TrialRecord, record_result, record_skip
from autotune.study.settings import stored_settings

KEPT_NAME = "result-to-store.json"
TAKEN_SUFFIX = ".taken"  # result-to-store.json.taken-<pid>-<start time>: a process took it


@dataclass(frozen=True)
class KeptResult:
    path: Path | None  # None: a result in hand, not (or no longer) on disk
    trial_number: int
    trial_id: int
    result: TaskResult
    duration_s: float
    owner: dict[str, Any]  # the process that measured it (claims.this_process)


def keep(trial_folder: Path, trial: optuna.Trial, result: TaskResult, duration_s: float) -> Path | None:
    """Write a trial's result beside its files; None when the disk refuses it (full): the storage is then its only
    way out, as before."""
    path = trial_folder / KEPT_NAME
    document = {"trial_number": trial.number, "trial_id": trial_id(trial), "started": _started(trial),
                "result": result.to_json(), "duration_s": duration_s, "owner": this_process()}  # fmt: skip
    try:
        write_json_atomically(path, document)
    except OSError:
        return None
    return path


def forget(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)


def take_kept(study: optuna.Study, study_folder: Path) -> list[KeptResult]:
    """The kept results of this study's trials in `study_folder` whose process is gone, each taken by this process.

    A study's trial files are in a folder named after it (in the cache, for a server database), which another
    study of the same name in another database shares: a kept result names its trial by id, number and start."""
    taken = []
    mine = f"{KEPT_NAME}{TAKEN_SUFFIX}-{_process_tag(this_process())}"
    for path, document in _kept_files(study, study_folder):
        if path.name == mine or _holder_alive(path, document):
            continue
        try:
            path.rename(path.with_name(mine))  # of two processes renaming the same file, one gets it
        except FileNotFoundError:
            continue
        taken.append(_kept_result(path.with_name(mine), document))
    return taken


def waiting(study: optuna.Study, study_folder: Path) -> set[int]:
    """This study's trials whose kept result is still on disk (the process that has it stores it now)."""
    return {document["trial_number"] for _, document in _kept_files(study, study_folder)}


def _kept_files(study: optuna.Study, study_folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in sorted(study_folder.glob(f"trial-*/{KEPT_NAME}*")):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):  # taken meanwhile, or half a file a full disk cut short
            continue
        if _of(study, document):
            found.append((path, document))
    return found


def _of(study: optuna.Study, document: dict[str, Any]) -> bool:
    """Whether a kept result is one of this study's trials."""
    storage = study_storage(study)
    try:
        number, started = document["trial_number"], document["started"]
        if storage.get_trial_id_from_study_id_trial_number(study_id(study), number) != document["trial_id"]:
            return False
    except KeyError:
        return False
    return _started(storage.get_trial(document["trial_id"])) == started


def _started(trial: optuna.Trial | FrozenTrial) -> str | None:
    return trial.datetime_start.isoformat() if trial.datetime_start else None


def _kept_result(path: Path, document: dict[str, Any]) -> KeptResult:
    result = TaskResult.from_json(migrations.kept_result(document["result"]))
    return KeptResult(path, document["trial_number"], document["trial_id"], result, document["duration_s"],
                      document["owner"])  # fmt: skip


def _holder_alive(path: Path, document: dict[str, Any]) -> bool:
    """Whether the process that wrote, or last took, this file still runs (it will store it itself)."""
    if path.name == KEPT_NAME:
        return owner_alive(document.get("owner") or {})
    pid, _, started = path.name.removeprefix(f"{KEPT_NAME}{TAKEN_SUFFIX}-").partition("-")
    try:
        return owner_alive({"pid": int(pid), "started": float(started)})
    except ValueError:
        return False


def _process_tag(owner: dict[str, Any]) -> str:
    return f"{owner['pid']}-{owner['started']}"


def store(study: optuna.Study, claims: Claims, kept: KeptResult) -> str | None:
    """Store a kept result on its trial, or on the trial's queued retry; None when its trial took it, else the
    line that says where it went, or why it was not stored."""
    storage = study_storage(study)
    trial = storage.get_trial(kept.trial_id)
    if trial.state == TrialState.RUNNING:
        try:
            _tell(study, kept.trial_id, kept)
            return None
        except (UpdateFinishedTrialError, ValueError):  # ValueError: Optuna's "Cannot tell a FAIL trial"
            trial = storage.get_trial(kept.trial_id)
            if trial.state == TrialState.RUNNING:  # not failed meanwhile by another process: a real error
                raise
    if not TrialRecord.from_frozen(trial).interrupted:
        return None  # stored already: its process ended after telling it, before removing the file
    return _store_on_retry(study, claims, kept, trial)


def store_kept(study: optuna.Study, claims: Claims, study_folder: Path) -> list[str]:
    """Store every kept result of `study_folder` another process left; a line for each."""
    lines = []
    for kept in take_kept(study, study_folder):
        line = store(study, claims, kept)
        pid = kept.owner.get("pid")
        lines.append(line or f"trial #{kept.trial_number}: the result its process (pid {pid}) kept on disk is stored")
        forget(kept.path)
    return lines


def _tell(study: optuna.Study, trial_id: int, kept: KeptResult) -> None:
    settings = stored_settings(study)
    trial = optuna.Trial(study, trial_id)
    record_result(study, trial, kept.result, kept.duration_s, settings.feasibility,
                  settings.objective_metrics)  # fmt: skip


def _store_on_retry(study: optuna.Study, claims: Claims, kept: KeptResult, failed: FrozenTrial) -> str:
    number = kept.trial_number
    storage = study_storage(study)
    retry = _retry_of(study, number)
    waiting = retry is not None and retry.state == TrialState.WAITING
    if waiting and _pop(study, claims, retry, failed.user_attrs.get("config_key", "")):
        retry_id = trial_id(retry)
        storage.set_trial_user_attr(retry_id, OWNER_ATTR, this_process())
        roles = list(dict.fromkeys([*failed.user_attrs.get("roles", []), "retry"]))
        storage.set_trial_user_attr(retry_id, "roles", roles)
        _tell(study, retry_id, kept)
        return (
            f"trial #{number} was failed as interrupted by another process (its heartbeats stopped reaching the "
            f"storage); the result its process (pid {kept.owner.get('pid')}) measured is stored on its retry, "
            f"trial #{retry.number}"
        )
    where = f"its retry #{retry.number}" if retry is not None else "its retry"
    return (
        f"trial #{number} was failed as interrupted by another process (its heartbeats stopped reaching the "
        f"storage), and {where} measures its configuration: the result its process (pid {kept.owner.get('pid')}) "
        "measured is not stored (that would measure the configuration twice)"
    )


def _pop(study: optuna.Study, claims: Claims, retry: FrozenTrial, config_key: str) -> bool:
    """Take a queued retry as `study.ask` would (WAITING to RUNNING, then its claim), and its configuration."""
    if not study_storage(study).set_trial_state_values(trial_id(retry), TrialState.RUNNING):
        return False  # another worker popped it first
    if not claims.take_trial(trial_id(retry), random.SystemRandom().randrange(1, 2**31)):
        return False  # and claimed it first: it is theirs
    holder = claim_configuration(study, claims, config_key, retry.number)
    if holder != retry.number:  # never left RUNNING: skipped, as the trial loop skips a claimed configuration
        record_skip(study, optuna.Trial(study, trial_id(retry)), retry.params, f"same configuration as trial #{holder}")
    return holder == retry.number


def _retry_of(study: optuna.Study, number: int) -> FrozenTrial | None:
    trials = study.get_trials(deepcopy=False)
    return next((trial for trial in trials if trial.system_attrs.get("failed_trial") == number), None)


def kept_note(trial_number: int, path: Path | None) -> str:
    """What a process that stops with a result unstored says of it."""
    if path is None:
        return f"; trial #{trial_number}'s result could not be kept on disk either (the disk refused it) and is lost"
    return (
        f"; trial #{trial_number}'s result is kept in {path}: the next `autotune worker` or `autotune search` on this "
        "study, on this machine, stores it"
    )
