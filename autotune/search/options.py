"""What a search is asked to do, what it reports while it runs, and what it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from autotune.constraints import Constraint
from autotune.errors import SearchError as SearchError  # re-exported; lives there so the CLI catches it cheaply
from autotune.paths import default_cache_dir
from autotune.results import QualitySpec, WorkloadSpec
from autotune.space import Config
from autotune.study import TrialRecord


@dataclass
class SearchOptions:
    model: str
    gpu: str = "auto"
    device: str | None = None
    budget_s: float | None = None
    max_trials: int | None = None
    space_path: Path | None = None
    study_name: str | None = None
    storage: str | None = None
    revision: str | None = None
    trust_remote_code: bool = False
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    quality: QualitySpec = field(default_factory=QualitySpec)
    trial_timeout_s: float = 1200.0
    cache_dir: Path = field(default_factory=default_cache_dir)
    studies_dir: Path = Path("studies")
    seed: int | None = None
    price_per_hour: float | None = None  # overrides the profile's price
    constraints: list[Constraint] = field(default_factory=list)  # passed to Optuna with trial.set_constraint
    devices: list[str] | None = None  # one worker per device, sharing the study
    warm_start: str | None = None  # a study of the same storage whose front is measured first
    run_id: str | None = None  # tags the trials of one run, across the workers of `--devices`
    artifacts: str | None = None  # where trial logs and reports go (autotune.artifacts); default beside SQLite


class SearchEvents(Protocol):
    def note(self, message: str) -> None: ...
    def progress(self, what: str) -> None: ...  # what the search is doing now (a phase), shown with elapsed time
    def trial_started(self, number: int, config: Config, roles: list[str]) -> None: ...
    def trial_finished(self, record: TrialRecord) -> None: ...


@dataclass
class SearchSummary:
    study_name: str
    storage: str
    launched: int
    stop_reason: str
    elapsed_s: float
    spent_s: dict[str, float]
