"""Constraints on a trial's figures, such as `peak_memory_gb<=20` or `kl<=0.01`.

One parser serves `autotune search --constraint` (passed to Optuna with `trial.set_constraint`, so
the sampler and `study.best_trials` keep to the feasible region) and `autotune best` (which picks
under them). A constraint is held in the metric's own unit (`METRICS` in autotune/figures/metrics/):
`memory<=20GB` becomes `peak_memory_gb <= 20`, `ttft_ms<=50` becomes `ttft_s <= 0.05`.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from autotune.errors import UserError
from autotune.figures.metrics import METRICS, Metric, constraint_names

# Names users type -> (metric, the unit a bare number is in): each metric declares its own (figures/metrics/).
ALIASES: dict[str, tuple[str, str]] = constraint_names()

# Unit written after the number -> (the metric unit it converts to, factor).
_UNITS: dict[str, tuple[str, float]] = {
    "b": ("gb", 1e-9),
    "kb": ("gb", 1e-6),
    "mb": ("gb", 1e-3),
    "gb": ("gb", 1.0),
    "tb": ("gb", 1e3),
    "kib": ("gb", 1024 / 1e9),
    "mib": ("gb", 1024**2 / 1e9),
    "gib": ("gb", 1024**3 / 1e9),
    "us": ("s", 1e-6),
    "ms": ("s", 1e-3),
    "s": ("s", 1.0),
    "tok/s": ("tok/s", 1.0),
    "gb/s": ("gb/s", 1.0),
    "usd": ("usd", 1.0),
    "req/s": ("req/s", 1.0),
    "j": ("j", 1.0),
    "mj": ("j", 1e-3),
    "$": ("usd", 1.0),
    "%": ("", 0.01),
}
_METRIC_UNIT = {
    "GB": "gb",
    "s": "s",
    "tok/s": "tok/s",
    "GB/s": "gb/s",
    "USD": "usd",
    "": "",
    "nats/token": "",
    "req/s": "req/s",
    "J": "j",
}

_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
_PATTERN = re.compile(
    r"^\s*(?P<name>[A-Za-z][\w.-]*)\s*(?P<op><=|>=|<|>)\s*"
    r"(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?P<unit>[A-Za-z%$/]*)\s*$"
)
FORM = 'METRIC OP VALUE, e.g. "peak_memory_gb<=20", "memory<=20GB", "kl<=0.01", "throughput>=500", "ttft_ms<=50"'
STRICT_MARGIN = 1e-9  # a strict bound that is met exactly is violated by this much (relative)


@dataclass(frozen=True)
class Constraint:
    metric: str  # a name in METRICS
    op: str  # <=, >=, <, >
    bound: float  # in the metric's unit

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"

    @property
    def label(self) -> str:
        """For people: `peak memory <= 20 GB`."""
        spec = METRICS[self.metric]
        unit = f" {spec.unit}" if spec.unit and spec.unit != "nats/token" else ""
        return f"{spec.label} {self.op} {self.bound:g}{unit}"

    def holds(self, metrics: Mapping[str, float]) -> bool:
        """True when the trial measured the metric and it satisfies the bound."""
        value = metrics.get(self.metric)
        return value is not None and math.isfinite(value) and _OPERATORS[self.op](value, self.bound)

    def violation(self, metrics: Mapping[str, float]) -> float:
        """Optuna's constraint value: <= 0 exactly when `holds`; > 0 grows with the relative excess.

        A figure the trial did not measure cannot be shown to hold, so it counts as violated (1.0).
        """
        value = metrics.get(self.metric)
        if value is None or not math.isfinite(value):
            return 1.0
        excess = value - self.bound if self.op in ("<=", "<") else self.bound - value
        scaled = excess / max(abs(self.bound), 1e-12)
        if self.op in ("<", ">") and scaled == 0:
            return STRICT_MARGIN
        return scaled


# What a workload with an SLO adds to a study's constraints: a trial that meets the SLO at no batch or load is
# infeasible, so off the front (its reason: the trial's capacity, autotune/figures/capacity.py).
MEETS_SLO = Constraint("meets_slo", ">=", 1.0)


def parse_constraint(text: str, shown: str | None = None) -> Constraint:
    """`memory<=20GB` -> Constraint("peak_memory_gb", "<=", 20.0); UserError when it cannot be read.

    `shown` names the input in messages when it came from a flag (`--max-memory '20 parsecs'`).
    """
    shown = shown or f"constraint {text!r}"
    match = _PATTERN.match(text)
    if match is None:
        raise UserError(f"cannot read {shown}: write it as {FORM}")
    name, unit = match["name"].lower(), match["unit"].lower()
    metric_name, default_unit = ALIASES.get(name, (name, None))
    if metric_name not in METRICS:
        known = ", ".join(sorted({*METRICS, *ALIASES}))
        raise UserError(f"{shown}: unknown metric {match['name']!r}; use one of {known}")
    metric = METRICS[metric_name]
    base_unit = _METRIC_UNIT.get(metric.unit, metric.unit.lower())
    factor = _factor(shown, unit or default_unit or base_unit, base_unit, metric)
    return Constraint(metric_name, match["op"], float(match["number"]) * factor)


def _factor(shown: str, unit: str, base_unit: str, metric: Metric) -> float:
    if unit == base_unit:
        return 1.0
    converted = _UNITS.get(unit)
    if converted is None or converted[0] != base_unit:
        in_unit = metric.unit or "no unit"
        raise UserError(f"{shown}: {metric.name} is in {in_unit}, and {unit!r} does not convert to it")
    return converted[1]


def parse_constraints(texts: Iterable[str]) -> list[Constraint]:
    """Parse each, drop repeats, keep the order given."""
    result: list[Constraint] = []
    for text in texts:
        constraint = parse_constraint(text)
        if constraint not in result:
            result.append(constraint)
    return result


def metric_name(text: str, flag: str) -> Metric:
    """A metric named as users type it (`throughput`, `memory`, `kl`, `ttft_ms`), for --maximize/--minimize."""
    name = text.strip().lower()
    resolved = ALIASES.get(name, (name, None))[0]
    if resolved not in METRICS:
        known = ", ".join(sorted({*METRICS, *ALIASES}))
        raise UserError(f"{flag} {text!r}: unknown metric; use one of {known}")
    return METRICS[resolved]


def violations(constraints: Iterable[Constraint], metrics: Mapping[str, float]) -> dict[str, float]:
    """Constraint name -> Optuna constraint value, for `trial.set_constraint`."""
    return {str(constraint): constraint.violation(metrics) for constraint in constraints}


def failed(constraints: Iterable[Constraint], metrics: Mapping[str, float]) -> list[Constraint]:
    return [constraint for constraint in constraints if not constraint.holds(metrics)]
