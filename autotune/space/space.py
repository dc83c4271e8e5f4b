"""The search space: knobs with their values, when each applies, and rules between knobs.

A configuration is a dict of the knobs that apply to it, in the space's order. A knob whose `when`
does not hold is absent, so two configurations that behave the same have the same key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from autotune.errors import SpaceError
from autotune.space.knobs import KNOBS, Value

if TYPE_CHECKING:
    import optuna

Config = dict[str, Value]


def config_key(config: Config) -> str:
    return json.dumps(config, sort_keys=True)


@dataclass(frozen=True)
class KnobSpec:
    name: str
    values: tuple[Value, ...]
    when: dict[str, tuple[Value, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Rule:
    forbid: dict[str, tuple[Value, ...]]
    reason: str

    def matches(self, config: Config) -> bool:
        return all(name in config and config[name] in values for name, values in self.forbid.items())


@dataclass(frozen=True)
class SearchSpace:
    knobs: tuple[KnobSpec, ...]
    rules: tuple[Rule, ...] = ()
    # knob -> value -> why it was taken out before the study (hardware profile, earlier failures).
    removed: dict[str, dict[str, str]] = field(default_factory=dict)

    def knob_names(self) -> list[str]:
        return [spec.name for spec in self.knobs]

    def knob(self, name: str) -> KnobSpec:
        for spec in self.knobs:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def applies(self, spec: KnobSpec, config: Config) -> bool:
        return all(name in config and config[name] in values for name, values in spec.when.items())

    def suggest(self, trial: optuna.Trial) -> Config:
        """Sample a configuration knob by knob; knobs whose `when` fails are not sampled."""
        config: Config = {}
        for spec in self.knobs:
            if self.applies(spec, config):
                config[spec.name] = trial.suggest_categorical(spec.name, list(spec.values))
        return config

    def violation(self, config: Config) -> str | None:
        """Why this configuration must not be launched, or None."""
        for spec in self.knobs:
            if spec.name in config and config[spec.name] not in spec.values:
                reason = self.removed.get(spec.name, {}).get(str(config[spec.name]))
                return reason or f"{spec.name}={config[spec.name]} is not in the space"
        for rule in self.rules:
            if rule.matches(config):
                return rule.reason
        return None

    def configurations(self) -> Iterator[Config]:
        """Every configuration the space allows, rules applied.

        A rule is checked as soon as the last knob it names is chosen, so a forbidden branch is never expanded.
        """
        position = {spec.name: index for index, spec in enumerate(self.knobs)}
        decided_at: dict[int, list[Rule]] = {}
        for rule in self.rules:
            if all(name in position for name in rule.forbid):  # a rule on a knob the space lacks never matches
                decided_at.setdefault(max(position[name] for name in rule.forbid), []).append(rule)

        def expand(index: int, config: Config) -> Iterator[Config]:
            if index == len(self.knobs):
                yield dict(config)
                return
            spec = self.knobs[index]
            if not self.applies(spec, config):
                yield from expand(index + 1, config)
                return
            rules = decided_at.get(index, ())
            for value in spec.values:
                chosen = {**config, spec.name: value}
                if not any(rule.matches(chosen) for rule in rules):
                    yield from expand(index + 1, chosen)

        return expand(0, {})

    def normalize(self, config: Config) -> Config:
        """Keep only the knobs that apply, in the space's order (for configurations built by hand)."""
        normalized: Config = {}
        for spec in self.knobs:
            if spec.name in config and self.applies(spec, normalized):
                normalized[spec.name] = config[spec.name]
        return normalized

    def without(self, name: str, value: Value, reason: str) -> SearchSpace:
        """This space with one value removed, remembering why."""
        knobs = tuple(
            replace(spec, values=tuple(v for v in spec.values if v != value)) if spec.name == name else spec
            for spec in self.knobs
        )
        removed = {knob: dict(values) for knob, values in self.removed.items()}
        removed.setdefault(name, {})[str(value)] = reason
        return replace(self, knobs=knobs, removed=removed)

    def prune(self, why_not: Callable[[str, Value], str | None]) -> SearchSpace:
        """Remove every value for which why_not(knob, value) gives a reason."""
        space = self
        for spec in self.knobs:
            for value in spec.values:
                reason = why_not(spec.name, value)
                if reason:
                    space = space.without(spec.name, value, reason)
        for spec in space.knobs:
            if not spec.values:
                raise SpaceError(f"no value of knob {spec.name!r} can run here: {space.removed[spec.name]}")
        return space

    def forbidding(self, excluded: dict[str, dict[str, str]]) -> SearchSpace:
        """This space with rules that forbid the given knob values ({knob: {value: reason}})."""
        rules = list(self.rules)
        for spec in self.knobs:
            reasons = excluded.get(spec.name, {})
            rules += [
                Rule({spec.name: (value,)}, reasons[str(value)]) for value in spec.values if str(value) in reasons
            ]
        return replace(self, rules=tuple(rules))

    def including(self, config: Config) -> SearchSpace:
        """This space with the values of `config` added where missing (baseline, reference)."""
        knobs = tuple(
            replace(spec, values=(*spec.values, config[spec.name]))
            if spec.name in config and config[spec.name] not in spec.values
            else spec
            for spec in self.knobs
        )
        return replace(self, knobs=knobs)

    def size(self) -> int:
        return sum(1 for _ in self.configurations())

    def to_json(self) -> dict[str, Any]:
        return {
            "knobs": [
                {"name": s.name, "values": list(s.values), "when": {k: list(v) for k, v in s.when.items()}}
                for s in self.knobs
            ],
            "rules": [{"forbid": {k: list(v) for k, v in r.forbid.items()}, "reason": r.reason} for r in self.rules],
            "removed": self.removed,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SearchSpace:
        knobs = tuple(
            KnobSpec(k["name"], tuple(k["values"]), {n: tuple(v) for n, v in k["when"].items()}) for k in data["knobs"]
        )
        rules = tuple(Rule({n: tuple(v) for n, v in r["forbid"].items()}, r["reason"]) for r in data["rules"])
        return cls(knobs, rules, data.get("removed", {}))

    def fingerprint(self) -> str:
        """Identifies a space by its knobs, values and rules (taken on the space as declared)."""
        declared = {key: value for key, value in self.to_json().items() if key != "removed"}
        return hashlib.sha256(json.dumps(declared, sort_keys=True).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------- loading


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, but a key written twice in one mapping is an error instead of the last one silently winning."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is written twice in one mapping; keep one", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_space(path: Path) -> SearchSpace:
    try:
        text = path.read_text()
    except OSError as error:
        raise SpaceError(
            f"cannot read search space {path}: {error.strerror}; pass --space PATH to a YAML file"
        ) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "invalid YAML"
        raise SpaceError(f"search space {path} has a YAML syntax error{where}: {problem}") from None
    return parse_space(data, str(path))


def parse_space(data: Any, origin: str) -> SearchSpace:
    if not isinstance(data, dict) or not isinstance(data.get("knobs"), dict) or not data["knobs"]:
        raise SpaceError(f"search space {origin} needs a 'knobs:' mapping of knob names to their values")
    unknown_sections = set(data) - {"knobs", "rules"}
    if unknown_sections:
        raise SpaceError(f"search space {origin}: unknown section(s) {sorted(unknown_sections)}; use knobs: and rules:")
    knobs: list[KnobSpec] = []
    for name, entry in data["knobs"].items():
        knobs.append(_parse_knob(name, entry, [k.name for k in knobs], origin))
    declared = {k.name: k for k in knobs}
    rules = tuple(_parse_rule(i, entry, declared, origin) for i, entry in enumerate(data.get("rules") or []))
    return SearchSpace(tuple(knobs), rules)


def _parse_knob(name: Any, entry: Any, earlier: list[str], origin: str) -> KnobSpec:
    if name not in KNOBS:
        raise SpaceError(f"search space {origin}: unknown knob {name!r}; known knobs: {', '.join(KNOBS)}")
    if isinstance(entry, list):
        entry = {"values": entry}
    if not isinstance(entry, dict) or not isinstance(entry.get("values"), list) or not entry["values"]:
        raise SpaceError(f"search space {origin}: knob {name!r} needs a non-empty list of values")
    extra = set(entry) - {"values", "when"}
    if extra:
        raise SpaceError(f"search space {origin}: knob {name!r} has unknown field(s) {sorted(extra)}")
    values = tuple(_check_value(name, value, origin) for value in entry["values"])
    if len(set(values)) != len(values):
        raise SpaceError(f"search space {origin}: knob {name!r} lists a value twice")
    when = _parse_condition(entry.get("when") or {}, f"'when' of {name!r}", origin)
    for other in when:
        if other not in earlier:
            raise SpaceError(f"search space {origin}: {name!r} depends on {other!r}, which must be declared before it")
    return KnobSpec(name, values, when)


def _parse_rule(index: int, entry: Any, declared: dict[str, KnobSpec], origin: str) -> Rule:
    where = f"rule {index + 1}"
    if not isinstance(entry, dict) or "forbid" not in entry or not entry.get("reason"):
        raise SpaceError(f"search space {origin}: {where} needs 'forbid:' (knob: values) and 'reason:'")
    forbid = _parse_condition(entry["forbid"], where, origin)
    for name in forbid:
        if name not in declared:
            raise SpaceError(f"search space {origin}: {where} names knob {name!r}, which the space does not declare")
    return Rule(forbid, str(entry["reason"]))


def _parse_condition(data: Any, where: str, origin: str) -> dict[str, tuple[Value, ...]]:
    if not isinstance(data, dict):
        raise SpaceError(f"search space {origin}: {where} must map knob names to a value or a list of values")
    condition = {}
    for name, values in data.items():
        if name not in KNOBS:
            raise SpaceError(f"search space {origin}: {where} names unknown knob {name!r}")
        listed = values if isinstance(values, list) else [values]
        condition[name] = tuple(_check_value(name, value, origin) for value in listed)
    return condition


def _check_value(name: str, value: Any, origin: str) -> Value:
    if isinstance(value, bool):  # YAML reads a bare off/on as a boolean
        value = "on" if value else "off"
    knob = KNOBS[name]
    if not isinstance(value, str | int) or not knob.accepts(value):
        raise SpaceError(
            f"search space {origin}: knob {name!r} does not take {value!r}; it takes {knob.describe_values()}"
        )
    return value
