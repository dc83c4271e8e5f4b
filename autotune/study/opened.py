"""A stored study, opened in one place: its settings, its trials as records, its front and the terms its figures at
capacity hold under, each read from storage once and typed (older stored forms read as today's:
autotune.study.migrations). The report, `best`, `compare`, `history` and the search's summary read a study through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import optuna

from autotune import for_tests
from autotune.figures.capacity import SloTarget
from autotune.study.patience import DEFAULT_WAITING, Waiting
from autotune.study.records import TrialRecord, front_numbers, records, with_evaluations
from autotune.study.settings import StudySettings, exclusions, search_runs, stored_settings, suspicions
from autotune.study.storage import load_stored_study
from autotune.workloads import slo_target


@dataclass(frozen=True)
class Terms:
    """What a study's figures at capacity hold under: its SLO, a request's generated tokens, its device and price."""

    target: SloTarget
    output_len: int
    device: str  # what the figures are per: GPU, or CPU for a study on the CPU profile
    price_per_hour: float | None  # of one device, the profile's

    @classmethod
    def of(cls, settings: StudySettings) -> Terms:
        workload = settings.workload
        device = "GPU" if settings.device_type == "cuda" else "CPU"
        return cls(slo_target(workload), workload.output_len, device, settings.profile.price_per_hour)


@dataclass
class OpenedStudy:
    """One stored study and what autotune reads of it."""

    name: str
    storage_url: str
    study: optuna.Study

    @classmethod
    def open(cls, name: str, storage_url: str, waiting: Waiting = DEFAULT_WAITING) -> OpenedStudy:
        """The study of this name in this storage; a UserError when there is none. Its storage waits out an outage
        as `waiting` says."""
        study = load_stored_study(storage_url, name, waiting)
        for_tests.hold("read")
        return cls(name, storage_url, study)

    @classmethod
    def of(cls, study: optuna.Study, storage_url: str) -> OpenedStudy:
        """A study already loaded (a search's own)."""
        return cls(study.study_name, storage_url, study)

    @cached_property
    def settings(self) -> StudySettings:
        return stored_settings(self.study)

    @cached_property
    def records(self) -> list[TrialRecord]:
        """Every trial, in order; an evaluated finalist's tier-1 figures (--eval) among its metrics."""
        return with_evaluations(records(self.study), self.study.user_attrs)

    @property
    def launched(self) -> list[TrialRecord]:
        """The trials given to a worker that have an outcome."""
        return [record for record in self.records if record.launched and record.outcome is not None]

    @cached_property
    def front_numbers(self) -> set[int]:
        """The numbers of its trials on its front (Optuna's `best_trials`)."""
        return front_numbers(self.study)

    @property
    def front(self) -> list[TrialRecord]:
        """Its launched trials on the front, best first by the first objective, then by trial number."""
        first = self.settings.objective_metrics[0]
        front = [record for record in self.launched if record.number in self.front_numbers]
        return sorted(front, key=lambda record: (first.minimised(record.metrics[first.name]), record.number))

    @cached_property
    def terms(self) -> Terms:
        return Terms.of(self.settings)

    @cached_property
    def runs(self) -> list[dict[str, Any]]:
        """Its `autotune search` runs: elapsed time, budget, stop reason, trials passed over."""
        return search_runs(self.study)

    @property
    def exclusions(self) -> dict[str, dict[str, str]]:
        return exclusions(self.study)

    @property
    def suspicions(self) -> dict[str, dict[str, dict[str, Any]]]:
        return suspicions(self.study)
