"""The only module that touches Optuna's private API (names starting with `_`).

Optuna 5 has no public way to compute a hypervolume, test a set of loss vectors for Pareto
optimality, read a trial's storage id, reach a study's storage or system attributes, or list the
trials whose heartbeat is stale. Each use is a small function here, resolved when it is first
called, so that an Optuna upgrade that moves one fails with a line naming it and the version
(tests/study/test_optuna_internals.py checks every one against the installed Optuna).
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import optuna


class OptunaInternalsError(RuntimeError):
    """A private Optuna API autotune relies on is gone in the installed version."""


WRITTEN_FOR = "5.0"  # the Optuna version these were read against


def missing_api(what: str) -> OptunaInternalsError:
    return OptunaInternalsError(
        f"Optuna {optuna.__version__} has no {what}, which autotune uses; install Optuna {WRITTEN_FOR}, "
        "or adapt autotune/study/optuna_internals.py to this version"
    )


def private_function(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise missing_api(f"{module}.{name}") from None


def private_attribute(owner: object, name: str) -> Any:
    try:
        return getattr(owner, name)
    except AttributeError:
        raise missing_api(f"{type(owner).__name__}.{name}") from None


# ------------------------------------------------------------------------------------- computing


def compute_hypervolume(loss_vectors: np.ndarray, reference_point: np.ndarray) -> float:
    """Volume dominated by loss vectors (all minimised) up to the reference point (Optuna's WFG)."""
    compute = private_function("optuna._hypervolume", "compute_hypervolume")
    return float(compute(loss_vectors, reference_point))


def is_pareto_front(loss_vectors: np.ndarray) -> np.ndarray:
    """Which loss vectors (all minimised) no other dominates: the test behind `study.best_trials`."""
    test = private_function("optuna.study._multi_objective", "_is_pareto_front")
    return test(loss_vectors, assume_unique_lexsorted=False)


# -------------------------------------------------------------------------------- ids and storage


def trial_id(trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
    """A trial's id in its storage (Trial and FrozenTrial show only its number)."""
    return private_attribute(trial, "_trial_id")


def study_storage(study: optuna.Study) -> optuna.storages.BaseStorage:
    return private_attribute(study, "_storage")


def study_id(study: optuna.Study) -> int:
    return private_attribute(study, "_study_id")


def study_system_attrs(study: optuna.Study) -> dict[str, Any]:
    """The study's system attributes (Study shows only its user attributes)."""
    return study_storage(study).get_study_system_attrs(study_id(study))


def set_study_system_attr(study: optuna.Study, key: str, value: Any) -> None:
    study_storage(study).set_study_system_attr(study_id(study), key, value)


def heartbeat_enabled(storage: optuna.storages.BaseStorage) -> bool:
    return private_function("optuna.storages._heartbeat", "is_heartbeat_enabled")(storage)


def stale_trial_ids(storage: optuna.storages.BaseStorage, study: optuna.Study) -> list[int]:
    """The ids of the trials that `optuna.storages.fail_stale_trials` is about to fail."""
    return private_attribute(storage, "_get_stale_trial_ids")(study_id(study))


# RDBStorage's private methods that reach the database, which Optuna's own code calls (its _CachedStorage, which
# every Study wraps around an RDBStorage, and fail_stale_trials): autotune's PatientStorage (study/patience.py)
# retries them through an outage as it does the public ones.
PRIVATE_STORAGE_CALLS = ("_get_trials", "_create_new_trial", "_set_trial_param", "_get_best_trial_id",
                         "_get_stale_trial_ids")  # fmt: skip
