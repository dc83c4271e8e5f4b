"""One knob changed on a configuration, changing the fewest others to keep it valid in the space."""

from __future__ import annotations

from autotune.space import Config, SearchSpace, config_key
from autotune.space.knobs import Value


class Changes:
    """`with_value` on one space, remembered: the strategy asks for the same changes at every step."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self._known: dict[tuple[str, str, str], Config | None] = {}

    def with_value(self, base: Config, name: str, value: Value) -> Config | None:
        key = (config_key(base), name, f"{type(value).__name__}:{value}")
        if key not in self._known:
            self._known[key] = with_value(self.space, base, name, value)
        return self._known[key]


def with_value(space: SearchSpace, base: Config, name: str, value: Value) -> Config | None:
    """`base` with `name` set to `value`, changing the fewest other knobs to make it valid, or None."""
    wanted = {**base, name: value}
    for parent, values in space.knob(name).when.items():  # e.g. compile needs cache_implementation=static
        if wanted.get(parent) not in values:
            wanted[parent] = values[0]
    wanted = fill(space, wanted)
    if space.violation(wanted) is None:
        return wanted
    for other in space.knobs:  # a rule forbids it as is: one more knob changed may allow it
        if other.name == name:
            continue
        for alternative in other.values:
            candidate = fill(space, {**wanted, other.name: alternative})
            if candidate.get(name) == value and space.violation(candidate) is None:
                return candidate
    return None


def fill(space: SearchSpace, config: Config) -> Config:
    """Give every knob that applies a value (the first one) when it has none, then drop the rest."""
    filled: Config = {}
    for spec in space.knobs:
        if space.applies(spec, filled):
            filled[spec.name] = config.get(spec.name, spec.values[0])
    return filled


def changed_knobs(base: Config, config: Config) -> dict[str, Value | None]:
    """The knobs whose value differs from `base`'s, with their value in `config` (None: left out)."""
    return {name: config.get(name) for name in base.keys() | config.keys() if base.get(name) != config.get(name)}


def describe(config: Config, base: Config) -> str:
    changed = [f"{name}={value}" for name, value in config.items() if base.get(name) != value]
    return ", ".join(changed) or "baseline"
