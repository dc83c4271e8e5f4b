"""`autotune best`: one configuration of a stored study picked under constraints (autotune.analysis.pick), with its
deploy card (autotune.report.cards): its figures, where it holds them, and its code."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.analysis.capacity import capacities
from autotune.analysis.pick import Goal, Pick, pick
from autotune.errors import NothingSatisfiesError
from autotune.figures.constraints import Constraint
from autotune.report.cards import DeployCard, deploy_card
from autotune.study.opened import OpenedStudy
from autotune.study.patience import DEFAULT_WAITING, Waiting


@dataclass(frozen=True)
class Best:
    """The configuration picked, how, and its card."""

    study: str
    pick: Pick
    card: DeployCard


def best(
    study_name: str, storage_url: str, asked: Sequence[Constraint], goal: Goal, waiting: Waiting = DEFAULT_WAITING
) -> Best:
    """The best complete trial for `goal` under the study's own constraints (its --constraint flags, its SLO) and
    those `asked`; NothingSatisfiesError (exit status 3) when no trial satisfies them."""
    opened = OpenedStudy.open(study_name, storage_url, waiting)
    settings = opened.settings
    constraints = [*settings.feasibility, *(c for c in asked if c not in settings.feasibility)]
    chosen = pick(opened.records, constraints, goal, settings.objective_metrics)
    if chosen.chosen is None:
        raise NothingSatisfiesError(chosen.why_none())
    baseline = next((r for r in opened.records if "baseline" in r.roles and r.complete), None)
    found = capacities([chosen.chosen, *([baseline] if baseline else [])], opened.terms)
    return Best(study_name, chosen, deploy_card(chosen.chosen, settings, baseline, found))
