"""autotune's search strategy: what to measure before the sampler takes over, and what to skip.

Chosen from benchmarks/replay.py, which replays strategies against an exhaustively measured grid:

- a warm-up set after the reference and the baseline: the baseline with one knob changed, once for
  every value of every knob, cheapest first. It maps each knob's effect on all three objectives in
  as many trials as there are knob values, and gives the sampler a spread-out start;
- configurations that earlier failures rule out are skipped without being run: after an
  out-of-memory error, any configuration that differs from that one only by needing more memory
  (a wider dtype, lighter quantization, more tokens per batch) is skipped too;
- then the sampler (see study.make_sampler).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from autotune.results import Outcome
from autotune.space import Config, SearchSpace, config_key

# Knobs whose values order the memory a configuration needs, all else equal (higher needs more).
MEMORY_RANK: dict[str, dict[str | int, int]] = {
    "dtype": {"float32": 2, "bfloat16": 1, "float16": 1},
    "quantization": {"none": 2, "bnb-8bit": 1, "bnb-4bit": 0},
}
NUMERIC_MEMORY_KNOBS = ("max_batch_tokens",)


@dataclass(frozen=True)
class Planned:
    config: Config
    why: str  # the trial's role, shown in the report: "warm-up: dtype=float16"


def warm_up_set(space: SearchSpace, baseline: Config) -> list[Planned]:
    """The baseline with one knob changed, for each value of each knob; cheap trials first."""
    planned: dict[str, Planned] = {}
    for spec in space.knobs:
        for value in spec.values:
            if baseline.get(spec.name) == value:
                continue
            config = _with_value(space, baseline, spec.name, value)
            if config is not None and config_key(config) not in planned and config != baseline:
                planned[config_key(config)] = Planned(config, f"warm-up: {spec.name}={value}")
    return sorted(planned.values(), key=lambda p: trial_cost(p.config))


def trial_cost(config: Config) -> int:
    """A rough order of trial durations: compiled trials are the slowest, continuous batching next."""
    return 2 * (config.get("compile", "off") != "off") + (config.get("batching") == "continuous")


def _with_value(space: SearchSpace, base: Config, name: str, value: str | int) -> Config | None:
    """`base` with `name` set to `value`, changing the fewest other knobs to make it valid, or None."""
    wanted = {**base, name: value}
    for parent, values in space.knob(name).when.items():  # e.g. compile needs cache_implementation=static
        if wanted.get(parent) not in values:
            wanted[parent] = values[0]
    wanted = _fill(space, wanted)
    if space.violation(wanted) is None:
        return wanted
    for other in space.knobs:  # a rule forbids it as is: one more knob changed may allow it
        if other.name == name:
            continue
        for alternative in other.values:
            candidate = _fill(space, {**wanted, other.name: alternative})
            if candidate.get(name) == value and space.violation(candidate) is None:
                return candidate
    return None


def _fill(space: SearchSpace, config: Config) -> Config:
    """Give every knob that applies a value (the first one) when it has none, then drop the rest."""
    filled: Config = {}
    for spec in space.knobs:
        if space.applies(spec, filled):
            filled[spec.name] = config.get(spec.name, spec.values[0])
    return filled


def next_planned(
    plan: list[Planned], taken: set[str], skip: Callable[[Config], object] = lambda config: None
) -> Planned | None:
    """The first planned configuration nobody has measured, claimed or queued, and `skip` does not refuse."""
    return next((p for p in plan if config_key(p.config) not in taken and not skip(p.config)), None)


def ruled_out(config: Config, history: Iterable[tuple[int, Config, str]]) -> str | None:
    """Why earlier outcomes make running this configuration pointless, or None.

    `history` holds (trial number, configuration, outcome) of finished trials.
    """
    for number, other, outcome in history:
        if outcome == Outcome.OOM and _needs_at_least_as_much_memory(config, other):
            return f"needs at least the memory of trial #{number}, which ran out of it"
    return None


def _needs_at_least_as_much_memory(config: Config, other: Config) -> bool:
    """Same knobs as `other` except memory-ordered ones, each at least as heavy."""
    if set(config) != set(other):
        return False
    for name in config:
        if name in MEMORY_RANK:
            ranks = MEMORY_RANK[name]
            if config[name] not in ranks or other[name] not in ranks or ranks[config[name]] < ranks[other[name]]:
                return False
        elif name in NUMERIC_MEMORY_KNOBS:
            if int(config[name]) < int(other[name]):
                return False
        elif config[name] != other[name]:
            return False
    return True
