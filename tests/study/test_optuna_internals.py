"""Optuna's private API, reached only through autotune/study/optuna_internals.py, on the installed Optuna.

When an Optuna upgrade moves one of them, these tests fail with a line naming it and the version.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import optuna
import pytest

from autotune import study as studies
from autotune.study import optuna_internals as internals

PACKAGE = Path(internals.__file__).parent
# An import from a private Optuna module, or a private attribute reached on one of its objects.
PRIVATE_USE = re.compile(r"optuna(\.\w+)*\._(?!_)\w+|\._(trial_id|study_id|storage|get_stale_trial_ids)\b")


@pytest.fixture
def running(tmp_path: Path) -> tuple[optuna.Study, optuna.Trial]:
    """A real SQLite study with heartbeats on, and one running trial."""
    storage = studies.open_storage(f"sqlite:///{tmp_path / 'internals.db'}")
    study = optuna.create_study(study_name="internals", storage=storage, directions=["maximize", "minimize"])
    return study, study.ask()


def test_every_private_api_autotune_uses_is_there(running):
    study, trial = running
    storage = internals.study_storage(study)
    assert isinstance(storage, optuna.storages.BaseStorage)
    assert internals.study_id(study) == storage.get_study_id_from_name("internals")
    assert storage.get_trial(internals.trial_id(trial)).number == trial.number
    internals.set_study_system_attr(study, "autotune-test", {"a": 1})
    assert internals.study_system_attrs(study)["autotune-test"] == {"a": 1}
    assert internals.heartbeat_enabled(storage) is True
    assert internals.stale_trial_ids(storage, study) == []  # its heartbeat is fresh
    for name in internals.PRIVATE_STORAGE_CALLS:  # retried through an outage (study/patience.py)
        assert callable(getattr(optuna.storages.RDBStorage, name)), name
    # (1, 1) and (0, 0) as losses: the first is dominated; the second alone spans 1.1 x 1.1.
    losses = np.array([[1.0, 1.0], [0.0, 0.0]])
    assert internals.is_pareto_front(losses).tolist() == [False, True]
    assert internals.compute_hypervolume(losses, np.array([1.1, 1.1])) == pytest.approx(1.21)


def test_a_moved_api_is_named_with_the_optuna_version():
    with pytest.raises(internals.OptunaInternalsError) as moved:
        internals.private_function("optuna._hypervolume", "compute_hypervolume_moved")
    assert str(moved.value).startswith(
        f"Optuna {optuna.__version__} has no optuna._hypervolume.compute_hypervolume_moved, which autotune uses"
    )
    with pytest.raises(internals.OptunaInternalsError, match=r"has no Study\._storage_moved"):
        internals.private_attribute(optuna.create_study(), "_storage_moved")


def test_no_other_module_touches_optunas_private_api():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "optuna_internals.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE_USE.search(line)
    ]
    assert offenders == [], "use autotune/study/optuna_internals.py instead:\n" + "\n".join(offenders)
