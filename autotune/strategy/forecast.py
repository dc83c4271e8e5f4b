"""What a configuration is expected to measure before it runs, and how long its trial will take.

A forecast starts from the baseline's figures (measured, or neutral ones before it ran) and adds the
effect of each knob the configuration changes:

- measured: the warm-up trial that made the same change to the baseline, when it ran;
- else expected: the knob handlers' priors (`Knob.expect`, what the guides lead one to expect on this
  device type), shifted by what the knob's other values measured against their own priors. On a request trace
  (goodput the study's speed), a change to continuous batching also gets back the decode steps the baseline's
  static batches spent on finished requests (its measured `wasted_share`), and a change from it pays them.

Speed and memory effects multiply (they add on a log scale); KL adds. Each forecast carries how unsure
it is, so the strategy can ask what a configuration could bring at best (`hopeful`), not only what it
should bring. Durations, expected and at most, come from strategy/durations.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from autotune.figures.metrics import (
    GOODPUT_TOKENS,
    KL_DIVERGENCE,
    OBJECTIVES,
    PEAK_MEMORY,
    THROUGHPUT,
    TPOT,
    WASTED_SHARE,
    Family,
    Metric,
)
from autotune.space import KNOBS, Config, SearchSpace, config_key
from autotune.space.knobs import DeviceType, Expectation
from autotune.strategy.changes import Changes
from autotune.strategy.durations import Durations

Measured = tuple[Config, Mapping[str, float]]  # a complete trial's configuration and figures

MEMORY = PEAK_MEMORY.name
KL = KL_DIVERGENCE.name
MEASUREMENT_SPREAD = 0.1  # run-to-run noise of a measured effect, on the log scale
MOST_WASTED = 0.95  # a wasted share read as at most this: what ending each request alone can get back stays finite


def family(metric: Metric) -> Family | None:
    """Which expected effect moves this figure: speed, time (inverse speed), memory, kl; None for none (kept as
    measured). Each metric declares it (figures/metrics/)."""
    return metric.forecast


def is_speed(metric: Metric) -> bool:
    return family(metric) in ("speed", "time")


@dataclass(frozen=True)
class Forecast:
    figures: dict[str, float]  # the objectives' expected figures
    hopeful: dict[str, float]  # one spread better on every objective: what it could bring
    seconds: float  # the trial's expected duration
    measured: bool = False  # the configuration has run: these are its figures


@dataclass(frozen=True)
class _Effect:
    """A change's effect on the log scale (speed, memory) and in nats/token (kl), and its variance."""

    speed: float = 0.0
    memory: float = 0.0
    kl: float = 0.0
    variance: float = 0.0

    def __add__(self, other: _Effect) -> _Effect:
        return _Effect(
            self.speed + other.speed,
            self.memory + other.memory,
            self.kl + other.kl,
            self.variance + other.variance,
        )


def _prior_effect(name: str, old: object, new: object, device: DeviceType) -> _Effect:
    knob = KNOBS.get(name)
    if knob is None:
        return _Effect()
    before = knob.expect(old, device) if old is not None else _default_expectation(name, device)
    after = knob.expect(new, device) if new is not None else _default_expectation(name, device)
    return _Effect(
        math.log(after.speed / before.speed),
        math.log(after.memory / before.memory),
        after.kl - before.kl,
        after.spread**2,
    )


def _default_expectation(name: str, device: DeviceType) -> Expectation:
    """A knob left out of a configuration runs as its transformers default."""
    knob = KNOBS[name]
    return knob.expect(knob.default, device) if knob.default is not None else Expectation(spread=0.0)


class Forecaster:
    """Forecasts for configurations of one space, from one baseline, on one device type."""

    def __init__(
        self,
        space: SearchSpace,
        baseline: Config,
        device: DeviceType,
        measured: Mapping[str, Measured],
        durations: Durations | None = None,
        objectives: Sequence[Metric] = OBJECTIVES,
        changes: Changes | None = None,
    ) -> None:
        self.space = space
        self.changes = changes or Changes(space)
        self.baseline = baseline
        self.device = device
        self.measured = measured
        self.durations = durations or Durations(baseline=baseline, device=device)
        self.objectives = tuple(objectives)
        self.speed_figure = _speed_figure(self.objectives)

    # ------------------------------------------------------------------------------------ figures

    def forecast(self, config: Config, measured_effects_only: bool = False) -> Forecast | None:
        """The configuration's forecast; with `measured_effects_only`, None unless a warm-up trial measured
        every change it makes to the baseline."""
        key = config_key(config)
        seconds = self.seconds(config)
        if key in self.measured:
            figures = dict(self.measured[key][1])
            return Forecast(figures, figures, seconds, measured=True)
        effect = self._effect(config, measured_effects_only)
        if effect is None:
            return None
        anchor = self._anchor()
        spread = math.sqrt(effect.variance)
        return Forecast(self._figures(anchor, effect, 0.0), self._figures(anchor, effect, spread), seconds)

    def _anchor(self) -> dict[str, float]:
        """The baseline's figures: measured, or neutral ones (1 for each figure, the priors' KL)."""
        entry = self.measured.get(config_key(self.baseline))
        if entry is not None:
            return dict(entry[1])
        kl = sum(self._expect(name, value).kl for name, value in self.baseline.items())
        return {metric.name: (max(kl, 0.0) if family(metric) == "kl" else 1.0) for metric in self.objectives}

    def _figures(self, anchor: Mapping[str, float], effect: _Effect, optimism: float) -> dict[str, float]:
        """The anchor moved by the effect; with `optimism` > 0, that many log units better on every objective."""
        figures = dict(anchor)
        for metric in self.objectives:
            value = anchor.get(metric.name)
            metric_family = family(metric)
            if value is None or metric_family is None:
                continue
            if metric_family == "speed":
                figures[metric.name] = value * math.exp(effect.speed + optimism)
            elif metric_family == "time":
                figures[metric.name] = value * math.exp(-effect.speed - optimism)
            elif metric_family == "memory":
                figures[metric.name] = value * math.exp(effect.memory - optimism)
            else:
                figures[metric.name] = max(value + effect.kl, 0.0) * math.exp(-optimism)
        return figures

    def _effect(self, config: Config, measured_only: bool = False) -> _Effect | None:
        """The sum of the changes' effects against the baseline: measured where a warm-up trial made the same
        change (with what that change brought along), expected elsewhere (or None when `measured_only`)."""
        changed = self._changes(config)
        total = _Effect()
        for name in reversed([spec.name for spec in self.space.knobs]):  # a knob before the ones it needs
            if name not in changed:
                continue
            single = self._single_change(name, config.get(name))
            covered = self._changes(single) if single is not None else {}
            if single is not None and covered and all(changed.get(k) == v for k, v in covered.items()):
                measured = self._measured_effect(single)
                if measured is not None:
                    total += measured
                    changed = {k: v for k, v in changed.items() if k not in covered}
                    continue
            if measured_only and config.get(name) is not None:  # a knob left out follows from another change
                return None
            total += self._expected_effect(name, self.baseline.get(name), config.get(name))
            changed.pop(name)
        return total

    def _changes(self, config: Config) -> dict[str, object]:
        """The knobs whose value differs from the baseline's, with their value here (None: left out)."""
        names = self.baseline.keys() | config.keys()
        return {name: config.get(name) for name in names if self.baseline.get(name) != config.get(name)}

    def _single_change(self, name: str, value: object) -> Config | None:
        """The warm-up configuration that changes this knob to this value (None: none can)."""
        return None if value is None else self.changes.with_value(self.baseline, name, value)  # type: ignore[arg-type]

    def _measured_effect(self, config: Config) -> _Effect | None:
        base, entry = self.measured.get(config_key(self.baseline)), self.measured.get(config_key(config))
        if base is None or entry is None:
            return None
        return _measured_difference(base[1], entry[1], self.speed_figure)

    def _expected_effect(self, name: str, old: object, new: object) -> _Effect:
        """The priors' effect of one change, shifted by what the knob's other values measured against theirs."""
        prior = self._prior(name, old, new)
        residuals = self._residuals.get(name, [])
        if not residuals:
            return prior
        weight = len(residuals) / (len(residuals) + 1)
        return _Effect(
            prior.speed + weight * statistics.fmean(r.speed for r in residuals),
            prior.memory + weight * statistics.fmean(r.memory for r in residuals),
            prior.kl + weight * statistics.fmean(r.kl for r in residuals),
            prior.variance / (len(residuals) + 1),
        )

    @cached_property
    def _residuals(self) -> dict[str, list[_Effect]]:
        """Per knob: how far its measured warm-up changes landed from what the priors expected."""
        residuals: dict[str, list[_Effect]] = {}
        for spec in self.space.knobs:
            for value in spec.values:
                single = self._single_change(spec.name, value)
                if single is None or self.baseline.get(spec.name) == value:
                    continue
                measured = self._measured_effect(single)
                if measured is None:
                    continue
                expected = _Effect()
                for name, new in self._changes(single).items():
                    expected += self._prior(name, self.baseline.get(name), new)
                residuals.setdefault(spec.name, []).append(
                    _Effect(
                        measured.speed - expected.speed,
                        measured.memory - expected.memory,
                        measured.kl - expected.kl,
                    )
                )
        return residuals

    def _prior(self, name: str, old: object, new: object) -> _Effect:
        """The priors' effect of one change, with the steps a trace's finished requests cost or give back."""
        return _prior_effect(name, old, new, self.device) + self._waste_effect(name, old, new)

    def _waste_effect(self, name: str, old: object, new: object) -> _Effect:
        """On goodput: a change to a value that ends each request alone no longer runs the decode steps the baseline
        measured on finished requests (its goodput over 1 - the wasted share), and a change from one pays them."""
        knob, base = KNOBS.get(name), self.measured.get(config_key(self.baseline))
        if knob is None or base is None or self.speed_figure != GOODPUT_TOKENS.name:
            return _Effect()
        wasted = min(base[1].get(WASTED_SHARE.name, 0.0), MOST_WASTED)
        turned = int(knob.ends_each_request_alone(new)) - int(knob.ends_each_request_alone(old))
        return _Effect(speed=-math.log(1 - wasted) * turned)

    def _expect(self, name: str, value: object) -> Expectation:
        knob = KNOBS.get(name)
        return knob.expect(value, self.device) if knob is not None else Expectation()

    # ---------------------------------------------------------------------------------- durations

    def seconds(self, config: Config) -> float:
        """The trial's expected duration (strategy/durations.py)."""
        return self.durations.of(config).expected


def _speed_figure(objectives: Sequence[Metric]) -> str:
    """The figure a measured change's speed is read from: goodput where a study replays a trace for it (the steps a
    static batch runs past its requests' ends do not count there), else decode throughput."""
    return GOODPUT_TOKENS.name if any(metric.name == GOODPUT_TOKENS.name for metric in objectives) else THROUGHPUT.name


def _measured_difference(before: Mapping[str, float], after: Mapping[str, float], speed_figure: str) -> _Effect:
    """What a measured change did: its speed figure (throughput, goodput on a trace; or per-token latency), memory
    and KL, on the forecast's scales."""
    speed = _log_ratio(after, before, speed_figure)
    if speed is None:
        inverse = _log_ratio(after, before, TPOT.name)
        speed = -inverse if inverse is not None else 0.0
    memory = _log_ratio(after, before, MEMORY) or 0.0
    kl = after.get(KL, 0.0) - before.get(KL, 0.0) if KL in after and KL in before else 0.0
    return _Effect(speed, memory, kl, MEASUREMENT_SPREAD**2)


def _log_ratio(after: Mapping[str, float], before: Mapping[str, float], name: str) -> float | None:
    a, b = after.get(name), before.get(name)
    if a is None or b is None or a <= 0 or b <= 0:
        return None
    return math.log(a / b)
