"""A configuration's answers on the task one night set against the night before's (autotune.analysis.task_changes):
paired over the items both judged, a regression only beyond chance (the exact one-sided sign test) and beyond the
tolerance; and `compare` naming it, exiting 3, in its table, its Markdown and its JSON."""

from __future__ import annotations

import pytest

from autotune.analysis.task_changes import ACCURACY, FLIPS, compare_tasks
from autotune.analysis.tolerances import DEFAULT_TOLERANCES
from autotune.study.evaluations import TaskAnswers

TOLERANCES = DEFAULT_TOLERANCES["cpu"]
ITEMS = [f"demo/{item}" for item in range(600)]
REFERENCE = {item: index % 5 == 0 for index, item in enumerate(ITEMS)}  # 20% right, as the demo reference's 19.5%
CONFIG = {"dtype": "bfloat16"}


def night(answers: dict[str, bool], reference: dict[str, bool] = REFERENCE, task: str = "demo") -> TaskAnswers:
    return TaskAnswers(task, reference, {3: answers})


def changed(answers: dict[str, bool], count: int, right: bool, start: int = 0) -> dict[str, bool]:
    """`answers` with `count` items that were not `right` made so, from the `start`-th such item on."""
    flipped = [item for item in ITEMS if answers[item] != right][start : start + count]
    return {**answers, **dict.fromkeys(flipped, right)}


def compared(before: dict[str, bool], after: dict[str, bool], **nights):
    comparison = compare_tasks(night(before), night(after, **nights), [(CONFIG, 3, 3)])
    assert comparison is not None
    return comparison


def test_the_same_answers_both_nights_are_no_change():
    comparison = compared(REFERENCE, REFERENCE)
    (change,) = comparison.changes
    assert (change.items, change.lost, change.gained, change.newly_flipped) == (600, 0, 0, 0)
    assert change.accuracy_p == 1.0 and comparison.regressed(TOLERANCES) == []
    assert change.recovery == 1.0 and change.recovery_low is not None and change.recovery_low < 1.0


def test_a_broken_decoding_path_loses_most_answers_and_regresses_accuracy_and_flips():
    broken = changed(REFERENCE, 110, right=False)  # as the demo's decode_drift: 110 of its right answers lost
    (change,) = compared(REFERENCE, broken).changes
    assert (change.lost, change.gained) == (110, 0) and change.accuracy_p < 1e-30
    assert change.regressed(TOLERANCES) == [ACCURACY, FLIPS]
    assert change.recovery_low is not None and change.recovery_low < change.recovery < 0.1


def test_a_few_answers_lost_are_within_chance_and_many_small_changes_within_the_tolerance():
    three = changed(REFERENCE, 3, right=False)  # 3 of 120 right answers lost: p = 1/8
    assert compared(REFERENCE, three).regressed(TOLERANCES) == []
    # 5 lost, none gained is beyond chance (p = 1/32), but 5 of 120 is a 4% loss: within the 5% tolerance
    five = changed(REFERENCE, 5, right=False)
    (change,) = compared(REFERENCE, five).changes
    assert change.accuracy_p == 1 / 32 and change.regressed(TOLERANCES) == []
    # ten lost: beyond both
    assert compared(REFERENCE, changed(REFERENCE, 10, right=False)).regressed(TOLERANCES)[0] == ACCURACY


def test_equal_accuracies_with_many_more_flips_regress_flips_only():
    """Dutta et al.: accuracy can hide flips. 20 right answers lost and 20 wrong ones gained."""
    swapped = changed(changed(REFERENCE, 20, right=False), 20, right=True, start=100)  # past the 20 lost
    (change,) = compared(REFERENCE, swapped).changes
    assert change.accuracy_before == change.accuracy_after and change.accuracy_p > 0.5
    assert change.newly_flipped == 40 and change.regressed(TOLERANCES) == [FLIPS]


def test_only_the_items_both_nights_judged_count_and_other_tasks_do_not_compare():
    fewer = {item: REFERENCE[item] for item in ITEMS[:60]}  # --eval-limit 60 the second night
    (change,) = compared(REFERENCE, fewer, reference=fewer).changes
    assert change.items == 60
    apart = compare_tasks(night(REFERENCE), night(REFERENCE, task="gsm8k"), [(CONFIG, 3, 3)])
    assert apart is not None and apart.changes == [] and "other tasks (demo, then gsm8k)" in (apart.apart or "")
    assert compare_tasks(None, night(REFERENCE), [(CONFIG, 3, 3)]) is None


@pytest.mark.parametrize(("accuracy", "flips", "expected"), [(0.5, 0.5, []), (0.0, 0.0, [ACCURACY, FLIPS])])
def test_the_tolerances_given_decide_what_is_too_small_to_matter(accuracy, flips, expected):
    from dataclasses import replace

    five = changed(REFERENCE, 5, right=False)
    assert compared(REFERENCE, five).regressed(replace(TOLERANCES, accuracy=accuracy, flips=flips)) == expected
