"""Tier 1's figures: a configuration's answers to a task's items set against the reference's answers to the same items.

Accuracy is the share of items it answers right; recovery, its accuracy over the reference's; flips, the share of items
right in one and wrong in the other (Dutta et al., "Accuracy is Not All You Need", 2024: equal accuracies can hide
many flips). Recovery carries a one-sided 95% lower bound. The items are shared, so the bound is paired: Newcombe's
method 10 (Newcombe 1998, "Improved confidence intervals for the difference between binomial proportions based on
paired data"), a Wilson score interval for each accuracy, combined through their correlation over the shared items.
Wilson, as vLLM's accuracy gate uses, because it holds with few items and with accuracies near 0 or 1; paired, because
an unpaired bound would count the items' own difficulty, which both configurations share, as noise and be far wider;
and a configuration with no flip on 50 items still gets a bound below 100% (the continuity-corrected correlation),
which 50 items cannot rule out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from autotune.figures.metrics import TASK_ACCURACY, TASK_FLIPS, TASK_ITEMS, TASK_RECOVERY, TASK_RECOVERY_LOW

Z_ONE_SIDED_95 = 1.6448536269514722
ALPHA = 0.05  # a one-sided test's level: chance alone reaches it once in twenty comparisons at most


def wilson(right: int, total: int, z: float = Z_ONE_SIDED_95) -> tuple[float, float]:
    """The Wilson score interval of a share `right / total` (each side at this z)."""
    if total == 0:
        return 0.0, 1.0
    share = right / total
    centre = share + z * z / (2 * total)
    spread = z * math.sqrt(share * (1 - share) / total + z * z / (4 * total * total))
    scale = 1 + z * z / total
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)


def paired_difference_low(both: int, lost: int, gained: int, neither: int, z: float = Z_ONE_SIDED_95) -> float:
    """The lower bound of (trial's accuracy - reference's) over shared items, Newcombe's method 10: `both` right in
    both, `lost` right in the reference only, `gained` right in the trial only, `neither` wrong in both."""
    total = both + lost + gained + neither
    reference, trial = (both + lost) / total, (both + gained) / total
    _, reference_high = wilson(both + lost, total, z)
    trial_low, _ = wilson(both + gained, total, z)
    product = (both + lost) * (gained + neither) * (both + gained) * (lost + neither)
    agreement = both * neither - lost * gained
    correlation = max(agreement - total / 2, 0.0) / math.sqrt(product) if product and agreement > 0 else 0.0
    below, above = trial - trial_low, reference_high - reference
    return (trial - reference) - math.sqrt(max(0.0, below**2 - 2 * correlation * below * above + above**2))


def task_figures(reference: Mapping[str, bool], answers: Mapping[str, bool]) -> dict[str, float]:
    """Accuracy, recovery and its lower bound, and flips of `answers` (item -> right) against the reference's, over the
    items both answered."""
    items = sorted(set(reference) & set(answers))
    if not items:
        return {}
    counts = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
    for item in items:
        counts[(bool(reference[item]), bool(answers[item]))] += 1
    both, lost, gained, neither = (
        counts[(True, True)],
        counts[(True, False)],
        counts[(False, True)],
        counts[(False, False)],
    )
    total = len(items)
    figures = {
        TASK_ITEMS: float(total),
        TASK_ACCURACY.name: (both + gained) / total,
        TASK_FLIPS.name: (lost + gained) / total,
    }
    reference_accuracy = (both + lost) / total
    if reference_accuracy > 0:
        figures[TASK_RECOVERY.name] = figures[TASK_ACCURACY.name] / reference_accuracy
        low = paired_difference_low(both, lost, gained, neither)
        figures[TASK_RECOVERY_LOW.name] = max(0.0, 1 + low / reference_accuracy)
    return figures


def one_sided_sign_p(worse: int, better: int) -> float:
    """The exact one-sided p-value of McNemar's test on paired items: the chance that, of the `worse + better` items
    whose answers changed, `worse` or more changed for the worse if either way were as likely (binomial, one half)."""
    changed = worse + better
    if changed == 0:
        return 1.0
    return sum(math.comb(changed, k) for k in range(worse, changed + 1)) / 2**changed
