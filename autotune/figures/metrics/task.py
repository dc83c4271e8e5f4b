"""Tier 1, the front's finalists (--eval TASK): the task's accuracy, its recovery against the reference's with a
one-sided 95% lower bound (paired: the items are the reference's; figures/task.py says which bound and why), and the
share of items right in one and wrong in the other."""

from __future__ import annotations

from autotune.figures.metrics.metric import FRONT, PERCENT, WHERE_MEASURED, Metric

TASK_ITEMS = "task_items"  # how many items of the task were judged
ON_THE_TASK = "on the task"
TASK_ACCURACY = Metric(
    "task_accuracy",
    "task accuracy",
    "",
    "maximize",
    short="accuracy",
    shown=FRONT,
    **PERCENT,
    beside=TASK_ITEMS,
    optional=True,
    card="accuracy {}",
    card_clause=ON_THE_TASK,
    compared=WHERE_MEASURED,
    after_search=True,
    history="accuracy",
    aliases=(("accuracy", ""),),
)
TASK_RECOVERY_LOW = Metric(
    "task_recovery_low",
    "task recovery, one-sided 95% lower bound",
    "",
    "maximize",
    after_search=True,
    aliases=(("recovery_low", ""),),
)
TASK_RECOVERY = Metric(
    "task_recovery",
    "task recovery: accuracy over the reference's",
    "",
    "maximize",
    short="recovery",
    shown=FRONT,
    **PERCENT,
    beside=TASK_RECOVERY_LOW.name,
    beside_form=" (>={:.1%})",
    optional=True,
    card="recovery {}",
    card_clause=ON_THE_TASK,
    compared=WHERE_MEASURED,
    after_search=True,
    aliases=(("recovery", ""),),
)
TASK_FLIPS = Metric(
    "task_flips",
    "answer flips vs reference",
    "",
    "minimize",
    short="flips",
    shown=FRONT,
    **PERCENT,
    beside=TASK_ITEMS,
    optional=True,
    card="flips {}",
    card_clause=ON_THE_TASK,
    compared=WHERE_MEASURED,
    after_search=True,
    history="flips",
    aliases=(("flips", ""),),
)
