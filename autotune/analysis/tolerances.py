"""How far each figure may move between two studies before it counts as a regression (`compare`, `history`).

Kept apart from the comparison itself, with no heavy import, so the command line can build it from its flags.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerances:
    """How far a figure may move before it counts, as a share of the earlier value."""

    throughput: float
    memory: float
    kl: float


# Run-to-run noise measured on this project's machines (docs/deploy.md, "The nightly job"): CPU throughput
# swings about ±20% between runs on a shared VM and CPU peak memory (process RSS) about 10%; on a GPU,
# throughput within a few percent and allocator peaks are nearly exact. KL is deterministic per stack.
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

    def on(self, device: str) -> Tolerances:
        defaults = DEFAULT_TOLERANCES.get(device, DEFAULT_TOLERANCES["cuda"])
        return Tolerances(
            throughput=defaults.throughput if self.throughput is None else self.throughput,
            memory=defaults.memory if self.memory is None else self.memory,
            kl=defaults.kl if self.kl is None else self.kl,
        )
