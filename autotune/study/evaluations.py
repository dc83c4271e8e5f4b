"""Tier 1 stored with the study: the task, the reference's answers to its items, each finalist's answers, and the
finalists the budget left unevaluated. A finished trial cannot take new user attributes in Optuna, so they are the
study's, one attribute per evaluated trial (no read-modify-write between writers); readers see each evaluated trial's
figures (autotune/figures/task.py) among its metrics.
"""

from __future__ import annotations

from typing import Any

import optuna

from autotune.figures.task import task_figures

TASK_ATTR = "evaluation"  # {"task", "limit", "metric", "reference": {"answers", "seconds"}, "unevaluated": [...]}
TRIAL_PREFIX = "evaluation:"  # + trial number: {"answers", "seconds", "path"}


def stored_task(study: optuna.Study) -> dict[str, Any] | None:
    return study.user_attrs.get(TASK_ATTR)


def store_task(study: optuna.Study, task: dict[str, Any]) -> None:
    study.set_user_attr(TASK_ATTR, task)


def store_answers(study: optuna.Study, number: int, evaluated: dict[str, Any]) -> None:
    study.set_user_attr(f"{TRIAL_PREFIX}{number}", evaluated)


def evaluated_numbers(attrs: dict[str, Any]) -> set[int]:
    return {int(key.removeprefix(TRIAL_PREFIX)) for key in attrs if key.startswith(TRIAL_PREFIX)}


def evaluation_figures(attrs: dict[str, Any]) -> dict[int, dict[str, float]]:
    """Trial number -> its tier-1 figures against the reference's answers, from the study's user attributes."""
    task = attrs.get(TASK_ATTR)
    if not task or "reference" not in task:
        return {}
    reference = task["reference"]["answers"]
    return {
        number: task_figures(reference, attrs[f"{TRIAL_PREFIX}{number}"]["answers"])
        for number in evaluated_numbers(attrs)
    }
