"""What a run (search, worker or measure) is asked to do: small frozen specs, each built once from the flags.

Light to import: the CLI builds them before the study's libraries (optuna, sqlalchemy) are loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.paths import default_cache_dir
from autotune.process.results import ModelSpec, QualitySpec, WorkloadSpec

if TYPE_CHECKING:
    from autotune.figures.constraints import Constraint


@dataclass(frozen=True)
class HardwareSpec:
    """The hardware profile trials are judged against, and where they run."""

    gpu: str = "auto"  # a profile name, or auto: detect
    device: str | None = None  # None: the profile's
    price_per_hour: float | None = None  # None: the profile's


@dataclass(frozen=True)
class BudgetSpec:
    """When a run stops (a wall-clock budget, a number of trials, or neither) and when one trial is killed."""

    budget_s: float | None = None
    max_trials: int | None = None
    trial_timeout_s: float = 1200.0

    def deadline(self, started: float) -> float | None:
        return started + self.budget_s if self.budget_s else None


@dataclass(frozen=True)
class StorageSpec:
    """Where a study, its trial logs and the cached models and references are kept."""

    study_name: str | None = None  # None: <model>-<profile>
    url: str | None = None  # None: an SQLite file in studies_dir
    artifacts: str | None = None  # where trial logs and reports go (autotune.study.artifacts); None: beside SQLite
    studies_dir: Path = Path("studies")
    cache_dir: Path = field(default_factory=default_cache_dir)


@dataclass(frozen=True)
class SearchRequest:
    """What a search, a worker or a measurement is asked to do; built once from the flags, never changed.

    A worker joining a study gets a new request with the study's model, workload and quality.
    """

    model: ModelSpec
    hardware: HardwareSpec = HardwareSpec()
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    quality: QualitySpec = field(default_factory=QualitySpec)
    budget: BudgetSpec = BudgetSpec()
    storage: StorageSpec = field(default_factory=StorageSpec)
    space_path: Path | None = None  # None: the packaged default space
    seed: int | None = None
    constraints: tuple[Constraint, ...] = ()  # passed to Optuna with trial.set_constraint
    objectives: tuple[str, ...] = ()  # metric names; empty: the study's own, or the default three for a new one
    devices: tuple[str, ...] = ()  # one worker per device, sharing the study
    warm_start: str | None = None  # a study of the same storage whose front is measured first
    run_id: str | None = None  # tags the trials of one run, across the workers of `--devices`


@dataclass(frozen=True)
class WorkerRequest:
    """`autotune worker`: which study to join and what this worker brings; the rest comes from the study."""

    storage: StorageSpec
    device: str | None = None
    budget: BudgetSpec = BudgetSpec()
    trust_remote_code: bool = False
    run_id: str | None = None
