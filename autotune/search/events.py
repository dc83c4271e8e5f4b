"""What a search reports while it runs, and what it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from autotune.analysis.found import BestFound
from autotune.errors import SearchError as SearchError  # re-exported; lives there so the CLI catches it cheaply
from autotune.space import Config
from autotune.study import TrialRecord


class SearchEvents(Protocol):
    def note(self, message: str) -> None: ...
    def progress(self, what: str) -> None: ...  # what the search is doing now (a phase), shown with elapsed time
    def trial_started(self, number: int, config: Config, roles: list[str]) -> None: ...
    def trial_finished(self, record: TrialRecord) -> None: ...


@dataclass
class SearchSummary:
    study_name: str
    storage_url: str
    launched: int
    stop_reason: str
    elapsed_s: float
    spent_s: dict[str, float]
    failed_workers: tuple[str, ...] = ()  # `search --devices`: each worker that ended with an error, and how
    best: tuple[BestFound, ...] = ()  # when each objective's best figure was found
    passed_over: tuple[str, ...] = ()  # planned trials not started: the budget left could not finish them
    evaluation: tuple[str, ...] = ()  # tier 1 (--eval): the task, each finalist's figures, those left unevaluated
    ended: float = 0.0  # time.monotonic() when the trial loop ended
    compiles: dict[str, int] = field(default_factory=dict)  # trials that compiled: "cold" / "warm" -> how many
