"""A configuration's answers on the task (tier 1) one night set against the night before's, item by item: whether it
answers fewer items right, or flips more of them against its night's reference, by more than a tolerance and by more
than chance explains (`autotune compare`, `autotune history`).

The items are the same each night, so the test is paired, on the items whose answer changed: of those, the ones
right the night before and wrong now against the ones wrong before and right now (or newly flipped against no longer
flipped). If the night changed nothing but noise, either way is as likely, and an exact one-sided sign test (McNemar's,
binomial with one half) says how often chance alone would tip the balance as far: below ALPHA it does not explain it.
An unpaired test would count the items' own difficulty, which both nights share, as noise. A change is a regression
when it is both beyond chance and beyond its tolerance (analysis/tolerances.py), so that a real change too small to
matter, and a large one a handful of items cannot show, are both left alone: three items lost and none gained is
p = 0.125, five is 0.031.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.analysis.tolerances import Tolerances
from autotune.figures.metrics import TASK_ACCURACY, TASK_FLIPS
from autotune.figures.task import ALPHA, one_sided_sign_p, paired_difference_low
from autotune.study.evaluations import TaskAnswers

ACCURACY, FLIPS = TASK_ACCURACY.label, TASK_FLIPS.label  # as regressions name them: "task accuracy", "answer flips..."


@dataclass(frozen=True)
class TaskChange:
    """One configuration evaluated both nights, its answers set against each other over the items both judged."""

    config: dict
    items: int
    accuracy_before: float
    accuracy_after: float
    lost: int  # right the night before, wrong now
    gained: int  # wrong the night before, right now
    flips_before: float  # the share of items flipped against that night's reference
    flips_after: float
    newly_flipped: int  # flipped against the reference now, not the night before
    unflipped: int  # flipped the night before, not now
    recovery_low: float | None  # its accuracy over the night before's: the one-sided 95% paired lower bound

    @property
    def recovery(self) -> float | None:
        """Its accuracy over the night before's; None where that was nothing."""
        return self.accuracy_after / self.accuracy_before if self.accuracy_before else None

    @property
    def accuracy_p(self) -> float:
        return one_sided_sign_p(self.lost, self.gained)

    @property
    def flips_p(self) -> float:
        return one_sided_sign_p(self.newly_flipped, self.unflipped)

    def regressed(self, tolerances: Tolerances) -> list[str]:
        """ACCURACY where it answers fewer right beyond chance and its tolerance (recovery against the night before
        below 1 - tolerance), FLIPS where it flips more beyond chance and its tolerance (in points of the items)."""
        found = []
        recovery = self.recovery
        if recovery is not None and self.accuracy_p < ALPHA and 1 - recovery > tolerances.accuracy:
            found.append(ACCURACY)
        if self.flips_p < ALPHA and self.flips_after - self.flips_before > tolerances.flips:
            found.append(FLIPS)
        return found


@dataclass(frozen=True)
class TaskComparison:
    """The configurations both nights evaluated on the task, and why none could be compared where none was."""

    task: str | None
    changes: list[TaskChange]
    apart: str | None = None  # why the nights' answers do not compare (other tasks)

    def regressed(self, tolerances: Tolerances) -> list[str]:
        """What regressed on some configuration: ACCURACY, FLIPS, in that order."""
        found = {name for change in self.changes for name in change.regressed(tolerances)}
        return [name for name in (ACCURACY, FLIPS) if name in found]


def compare_tasks(
    before: TaskAnswers | None, after: TaskAnswers | None, pairs: Sequence[tuple[dict, int, int]]
) -> TaskComparison | None:
    """Each configuration of `pairs` (its trial the night before, its trial now) that both nights evaluated; None
    where either night was not evaluated on a task."""
    if before is None or after is None:
        return None
    if before.task != after.task:
        return TaskComparison(None, [], f"evaluated on other tasks ({before.task}, then {after.task})")
    changes = [
        _change(config, before, after, then, now)
        for config, then, now in pairs
        if then in before.trials and now in after.trials
    ]
    return TaskComparison(after.task, [change for change in changes if change is not None])


def _change(config: dict, before: TaskAnswers, after: TaskAnswers, then: int, now: int) -> TaskChange | None:
    answers_then, answers_now = before.trials[then], after.trials[now]
    items = sorted(set(answers_then) & set(answers_now) & set(before.reference) & set(after.reference))
    if not items:
        return None
    right_then = [bool(answers_then[item]) for item in items]
    right_now = [bool(answers_now[item]) for item in items]
    flipped_then = [right != bool(before.reference[item]) for item, right in zip(items, right_then, strict=True)]
    flipped_now = [right != bool(after.reference[item]) for item, right in zip(items, right_now, strict=True)]
    both = sum(a and b for a, b in zip(right_then, right_now, strict=True))
    lost = sum(a and not b for a, b in zip(right_then, right_now, strict=True))
    gained = sum(b and not a for a, b in zip(right_then, right_now, strict=True))
    total = len(items)
    accuracy_before = (both + lost) / total
    low = paired_difference_low(both, lost, gained, total - both - lost - gained) if accuracy_before else None
    return TaskChange(
        config,
        total,
        accuracy_before,
        (both + gained) / total,
        lost,
        gained,
        sum(flipped_then) / total,
        sum(flipped_now) / total,
        sum(now_ and not then_ for then_, now_ in zip(flipped_then, flipped_now, strict=True)),
        sum(then_ and not now_ for then_, now_ in zip(flipped_then, flipped_now, strict=True)),
        max(0.0, 1 + low / accuracy_before) if low is not None else None,
    )
