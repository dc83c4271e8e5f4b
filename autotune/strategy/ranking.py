"""How the strategy orders what it could measure next: by what each is expected to add to the Pareto front per
expected second (strategy/forecast.py's forecasts), in tiers around the study's first objective."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from autotune.analysis.pareto import hypervolume, raw_losses, scaled
from autotune.figures.metrics import Metric
from autotune.space import Config, config_key
from autotune.strategy.forecast import Forecast, Forecaster, family


@dataclass(frozen=True)
class Planned:
    config: Config
    why: str  # the trial's role, shown in the report: "warm-up: dtype=float16"


GAIN_FLOOR = 1e-9
LOSS_MARGIN = 0.03  # a forecast this much worse than the baseline on the first objective is expected to lose


@dataclass(frozen=True)
class Scored:
    planned: Planned
    forecast: Forecast
    gain: float  # hypervolume its hopeful figures would add to what was measured
    tier: int  # see Tier
    warm_up: bool

    def key(self) -> tuple:
        """By tier; then what it could add per second; then the warm-up changes that could add nothing, cheapest
        first."""
        rate = self.gain / max(self.forecast.seconds, 1e-9)
        return (self.tier, self.gain <= GAIN_FLOOR, -rate, self.forecast.seconds)


class Tier(IntEnum):
    """The order of what follows the recommended stacks that run first."""

    LEAD_SIBLING = 0  # another value of a knob the first objective's stack sets, expected to win on that objective
    WAITING_STACK = 1  # a stack recommended for another objective, expected to lose on the first one (4-bit weights)
    OTHER = 2
    LOSES_LEAD = 3  # expected to do worse than the baseline on the study's first objective


def rank(
    forecaster: Forecaster,
    candidates: Iterable[tuple[Planned, bool]],
    lead_siblings: frozenset[str] = frozenset(),
    waiting_stacks: frozenset[str] = frozenset(),
) -> list[Scored]:
    """Candidates (planned, is a warm-up change) in the order they should run: see Scored.key and Tier. A composition
    or predicted change that could add nothing to the front is left out; a warm-up change never is. The two sets hold
    configuration keys (next_queued says which)."""
    objectives = forecaster.objectives
    measured = [figures for _, figures in forecaster.measured.values()]
    raw = raw_losses(measured, objectives) if measured else np.empty((0, len(objectives)))
    baseline = forecaster.forecast(forecaster.baseline).figures  # type: ignore[union-attr] - never None
    scored = []
    for planned, warm_up in candidates:
        forecast = forecaster.forecast(planned.config, measured_effects_only=not warm_up)
        if forecast is None:
            continue
        gain = _hypervolume_gain(raw, raw_losses([forecast.hopeful], objectives))
        if gain <= GAIN_FLOOR and not warm_up:
            continue
        key = config_key(planned.config)
        if key in lead_siblings and _wins(objectives[0], forecast.figures, baseline):
            tier = Tier.LEAD_SIBLING
        elif key in waiting_stacks:
            tier = Tier.WAITING_STACK
        else:
            tier = Tier.LOSES_LEAD if loses(objectives[0], forecast.figures, baseline) else Tier.OTHER
        scored.append(Scored(planned, forecast, gain, tier, warm_up))
    return sorted(scored, key=Scored.key)


def _wins(metric: Metric, figures: Mapping[str, float], baseline: Mapping[str, float]) -> bool:
    value, base = figures.get(metric.name), baseline.get(metric.name)
    if value is None or base is None or family(metric) == "kl" or not base:
        return False
    ratio = value / base
    return ratio > 1 + LOSS_MARGIN if metric.direction == "maximize" else ratio < 1 - LOSS_MARGIN


def loses(metric: Metric, figures: Mapping[str, float], baseline: Mapping[str, float]) -> bool:
    value, base = figures.get(metric.name), baseline.get(metric.name)
    if value is None or base is None:
        return False
    if family(metric) == "kl":
        return value > base + 1e-4
    ratio = value / base if base else 1.0
    return ratio < 1 - LOSS_MARGIN if metric.direction == "maximize" else ratio > 1 + LOSS_MARGIN


def _hypervolume_gain(raw: np.ndarray, candidate: np.ndarray) -> float:
    """Hypervolume one more point adds, all losses scaled to the bounds of the set with it."""
    if not np.all(np.isfinite(candidate)):
        return 0.0
    if not len(raw):
        return 1.0
    both = np.vstack([raw, candidate])
    low, high = both.min(axis=0), both.max(axis=0)
    return hypervolume(scaled(both, low, high)) - hypervolume(scaled(raw, low, high))
