"""Tier 1 stored with the study: the task, the reference's answers to its items, each finalist's answers, and the
finalists the budget left unevaluated. A finished trial cannot take new user attributes in Optuna, so they are the
study's, one attribute per evaluated trial, and one per trial a budget left out (no read-modify-write between the
processes of a study that evaluate); readers see each evaluated trial's figures (autotune/figures/task.py) among its
metrics. Which process evaluates which trial is claimed beside them (study/claims.py, Evaluations).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import optuna

from autotune.figures.task import task_figures

TASK_ATTR = "evaluation"  # {"task", "limit", "metric", "reference": {"answers", "seconds"}, "unevaluated": [...]}
TRIAL_PREFIX = "evaluation:"  # + trial number: {"answers", "seconds", "path"}
LEFT_OUT_PREFIX = "evaluation left out:"  # + trial number: why a budget left it out ("may take 40s, 12s left")


def stored_task(study: optuna.Study) -> dict[str, Any] | None:
    return study.user_attrs.get(TASK_ATTR)


def store_task(study: optuna.Study, task: dict[str, Any]) -> None:
    study.set_user_attr(TASK_ATTR, task)


def store_answers(study: optuna.Study, number: int, evaluated: dict[str, Any]) -> None:
    study.set_user_attr(f"{TRIAL_PREFIX}{number}", evaluated)


def evaluated_numbers(attrs: dict[str, Any]) -> set[int]:
    return {int(key.removeprefix(TRIAL_PREFIX)) for key in attrs if key.startswith(TRIAL_PREFIX)}


def store_left_out(study: optuna.Study, number: int, why: str) -> None:
    study.set_user_attr(f"{LEFT_OUT_PREFIX}{number}", why)


def unevaluated(attrs: dict[str, Any]) -> list[str]:
    """The trials a budget left unevaluated and none evaluated since: "#7 (may take 40s, 12s left)". A study searched
    before its evaluations were claimed (issue 69) holds them as one list in its task, best first."""
    evaluated = evaluated_numbers(attrs)
    listed = (attrs.get(TASK_ATTR) or {}).get("unevaluated") or []
    left_out = {
        int(key.removeprefix(LEFT_OUT_PREFIX)): why for key, why in attrs.items() if key.startswith(LEFT_OUT_PREFIX)
    }
    entries = [(_number(entry), entry) for entry in listed]
    entries += [(number, f"#{number} ({left_out[number]})") for number in sorted(left_out)]
    shown: dict[int, str] = {}
    for number, entry in entries:
        if number not in evaluated:
            shown.setdefault(number, entry)
    return list(shown.values())


def _number(entry: str) -> int:
    found = re.match(r"#(\d+)", entry)
    return int(found.group(1)) if found else -1


@dataclass(frozen=True)
class TaskAnswers:
    """A study's answers on its task: the reference's and each evaluated trial's (item -> right), to set one night's
    against another's item by item (analysis/task_changes.py)."""

    task: str
    reference: dict[str, bool]
    trials: dict[int, dict[str, bool]]


def task_answers(attrs: dict[str, Any]) -> TaskAnswers | None:
    task = attrs.get(TASK_ATTR)
    if not task or "reference" not in task:
        return None
    trials = {number: attrs[f"{TRIAL_PREFIX}{number}"]["answers"] for number in evaluated_numbers(attrs)}
    return TaskAnswers(task["task"], task["reference"]["answers"], trials)


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
