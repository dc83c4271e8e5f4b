"""How far each figure may move between two studies before it counts as a regression (`compare`, `history`).

Kept apart from the comparison itself, with no heavy import, so the command line can build it from its flags.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Tolerances:
    """How far a figure may move before it counts, as a share of the earlier value."""

    throughput: float
    memory: float
    kl: float
    accuracy: float = 0.05  # tier 1: accuracy lost, as a share of the night before's (recovery below 95%)
    flips: float = 0.02  # tier 1: more items flipped against the reference, in points of the items


# Run-to-run noise measured on this project's machines (docs/deploy.md, "The nightly job"): CPU throughput
# swings about ±20% between runs on a shared VM and CPU peak memory (process RSS) about 10%; on a GPU,
# throughput within a few percent and allocator peaks are nearly exact. KL is deterministic per stack. A task's
# answers are too, on one stack (docs/deploy.md, "Gated on the task"); what a new stack moves is judged by a paired
# test (analysis/task_changes.py), and these tolerances keep a change too small to matter from regressing: 5% of the
# accuracy, as llm-compressor's recovery gate (0.95), and 2 points of the items flipped.
DEFAULT_TOLERANCES = {
    "cuda": Tolerances(throughput=0.05, memory=0.05, kl=0.10),
    "cpu": Tolerances(throughput=0.25, memory=0.15, kl=0.10),
}


@dataclass(frozen=True)
class GivenTolerances:
    """The tolerances a user gave; each one not given is the default for the earlier study's device."""

    throughput: float | None = None
    memory: float | None = None
    kl: float | None = None
    accuracy: float | None = None
    flips: float | None = None

    def on(self, device: str) -> Tolerances:
        defaults = DEFAULT_TOLERANCES.get(device, DEFAULT_TOLERANCES["cuda"])
        given = {name: value for name, value in vars(self).items() if value is not None}
        return replace(defaults, **given)
