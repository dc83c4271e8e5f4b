"""Tier 1's figures: accuracy, recovery with its one-sided paired lower bound (Newcombe's method 10), flips."""

from __future__ import annotations

import pytest

from autotune.figures.task import one_sided_sign_p, paired_difference_low, task_figures, wilson


def test_the_wilson_interval_is_the_formulas():
    """40% of 50 at z=1.96: centre 0.4 + z²/100 = 0.43841, spread z·sqrt(0.24/50 + z²/10000) = 0.14112, scale
    1 + z²/50 = 1.07683: 0.27608 to 0.53819."""
    low, high = wilson(20, 50, z=1.959963984540054)
    assert (round(low, 4), round(high, 4)) == (0.2761, 0.5382)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0


def test_the_paired_bound_is_tighter_than_an_unpaired_one_where_the_items_agree():
    """Without correlation (answers that agree no more than chance), Newcombe's method 10 is the unpaired hybrid Wilson
    bound; items both answer alike tighten it."""
    trial_low, reference_high = wilson(20, 40)
    unpaired = -(((0.5 - trial_low) ** 2 + (reference_high - 0.5) ** 2) ** 0.5)
    assert paired_difference_low(10, 10, 10, 10) == pytest.approx(unpaired)  # both right as often as chance: phi 0
    assert paired_difference_low(18, 2, 2, 18) > paired_difference_low(10, 10, 10, 10)  # same accuracies, 4 flips


def test_items_right_and_wrong_in_each_give_accuracy_recovery_and_flips():
    reference = {str(item): item < 20 for item in range(50)}  # 40%
    answers = {**reference, "0": False, "1": False, "30": True}  # two lost, one gained
    figures = task_figures(reference, answers)
    assert figures["task_items"] == 50 and figures["task_accuracy"] == pytest.approx(19 / 50)
    assert figures["task_recovery"] == pytest.approx(19 / 20) and figures["task_flips"] == pytest.approx(3 / 50)
    assert figures["task_recovery_low"] < figures["task_recovery"]


def test_no_flip_on_few_items_still_bounds_recovery_below_one_and_more_items_tighten_it():
    few = {str(item): item % 2 == 0 for item in range(50)}
    many = {str(item): item % 2 == 0 for item in range(1000)}
    low_few, low_many = task_figures(few, few)["task_recovery_low"], task_figures(many, many)["task_recovery_low"]
    assert low_few < low_many < 1.0
    assert task_figures(few, few)["task_recovery"] == 1.0


def test_only_shared_items_count_and_a_reference_with_none_right_has_no_recovery():
    assert task_figures({"a": True}, {"b": True}) == {}
    figures = task_figures({"a": False, "b": False}, {"a": True, "b": False})
    assert "task_recovery" not in figures and figures["task_flips"] == 0.5


def test_the_sign_test_is_the_binomial_tail_of_the_items_that_changed():
    """Of n changed items, k or more for the worse at one half each: sum of C(n, i) / 2^n for i >= k."""
    assert one_sided_sign_p(5, 0) == 1 / 32 and one_sided_sign_p(3, 0) == 1 / 8
    assert one_sided_sign_p(2, 1) == (3 + 1) / 8  # C(3,2) + C(3,3) over 2^3
    assert one_sided_sign_p(0, 0) == 1.0 and one_sided_sign_p(0, 4) == 1.0
    assert one_sided_sign_p(110, 0) == 2.0**-110  # the decode_drift night of the demo: 110 lost, none gained
    assert one_sided_sign_p(4, 4) > 0.5  # as many either way: nothing to explain
