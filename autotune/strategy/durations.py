"""How long a trial will take, from the trials that ended: what to expect, and at most.

The strategy ranks trials by what they bring per *expected* second; the budget starts a trial only when it
takes *at most* the seconds left (an upper estimate, not the mean: a trial cut at the deadline measures
nothing, and a median that fits is a coin toss at the end of a search).

Expected, in order:

- alike: trials with the same duration groups (`Knob.duration_group`: compile mode, batching, quantization,
  tensor parallelism) ran. Their median, in plain trials (each divided by the priors' `time` factors of its
  knobs), times this configuration's factors: a knob outside the groups (flex attention compiling its kernel)
  still counts.
- a sibling: a trial that differs only by another value of one knob that slows a trial down (its prior
  `time` above 1). Its time over the rest of its configuration (as the priors put it), scaled by the ratio
  of the two values' priors (`time` - 1): a max-autotune compile is expected 3.5x as long as the
  reduce-overhead compile the study measured.
- else the priors: a plain trial (the baseline's kind; else any trial ended, divided by its factors) times
  this configuration's `time` factors.

A trial expected to compile warm (its configuration compiled before in the study, or in the study it was warm-started
from, so its graphs are in the study's compile cache) is expected from the trials alike that compiled warm, where any
ended; else as a cold one. A warm trial never counts among the cold ones: on the demo a warm compile took 13% of a cold
one.

At most: the expected times a margin for the spread seen, `ALIKE_MARGIN` where trials ran alike and
`EXTRAPOLATED_MARGIN` where it was estimated from others, plus the workload's probe allowance: the seconds a trial's
capacity probe may add over an alike trial that took a shorter course (`WorkloadKind.probe_allowance_s`: a serve
bracket of rates sends its requests for a time its levels fix). Before any trial ended there is no scale, and no
trial is held back (the deadline still stops it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

from autotune.process.results import WARM, Outcome
from autotune.space import KNOBS, Config, config_key
from autotune.space.knobs import DeviceType
from autotune.study import TrialRecord

# The largest ratio seen of a trial's duration to its expected one, rounded up (the budget replay on the
# CPU grids and the H200 run, docs/search-strategy.md): 1.26 where trials ran alike (all but 2 of 471 trials: 1.49
# and 7.95), 1.36 where it was extrapolated (23 trials).
ALIKE_MARGIN = 1.3
EXTRAPOLATED_MARGIN = 1.4


@dataclass(frozen=True)
class Duration:
    expected: float  # seconds; in plain trials (1.0 for a plain one) before any trial ended
    at_most: float | None  # the budget's check; None before any trial ended: nothing known to overrun
    alike: bool  # trials alike ran: estimated from them, not extrapolated


Ended = tuple[Config, float]  # a trial that ran to its end (whatever its outcome) and its seconds


class Durations:
    """Expected and at-most durations of trials, from those that ended, for one baseline on one device type."""

    def __init__(
        self,
        ended: Sequence[Ended] = (),
        baseline: Config | None = None,
        device: DeviceType = "cpu",
        allowance_s: float = 0.0,
        warm: Sequence[Ended] = (),
        expected_warm: Collection[str] = (),
    ):
        self.ended = tuple(ended)  # cold, or compiling nothing
        self.baseline = baseline or {}
        self.device = device
        self.allowance_s = allowance_s  # seconds, added to every at-most duration (a probe's longer courses)
        self.warm = tuple(warm)  # trials that compiled warm
        self.expected_warm = frozenset(expected_warm)  # keys of the configurations whose compiled code the study holds

    def of(self, config: Config) -> Duration:
        alike = self._warm_alike(config) or self._in_plain_trials.get(duration_kind(config))
        if alike:
            expected, margin = statistics.median(alike) * self.factor(config), ALIKE_MARGIN
        else:
            expected, margin = self._from_sibling(config) or self._plain * self.factor(config), EXTRAPOLATED_MARGIN
        at_most = expected * margin + self.allowance_s if self.ended else None
        return Duration(expected, at_most, alike=bool(alike))

    def _warm_alike(self, config: Config) -> list[float]:
        """The warm trials alike, in plain trials, where this configuration is expected to compile warm."""
        if config_key(config) not in self.expected_warm:
            return []
        kind = duration_kind(config)
        return [seconds / self.factor(ran) for ran, seconds in self.warm if duration_kind(ran) == kind]

    def factor(self, config: Config) -> float:
        """The priors' duration against a plain trial: the product of its knobs' `time` factors."""
        return math.prod(self._time(name, value) for name, value in config.items())

    def _time(self, name: str, value: object) -> float:
        knob = KNOBS.get(name)
        return knob.expect(value, self.device).time if knob is not None and value is not None else 1.0  # type: ignore[arg-type]

    @cached_property
    def _kinds(self) -> list[tuple[tuple, Config, float]]:
        return [(duration_kind(config), config, seconds) for config, seconds in self.ended]

    @cached_property
    def _in_plain_trials(self) -> dict[tuple, list[float]]:
        """Per duration kind: the trials that ended, each in plain trials (its seconds over its factors)."""
        by_kind: dict[tuple, list[float]] = {}
        for kind, config, seconds in self._kinds:
            by_kind.setdefault(kind, []).append(seconds / self.factor(config))
        return by_kind

    @cached_property
    def _plain(self) -> float:
        """A plain trial's seconds: the baseline's kind, else every trial ended; 1 (a unit) before any."""
        plain = self._in_plain_trials.get(duration_kind(self.baseline))
        every = [value for values in self._in_plain_trials.values() for value in values]
        return statistics.median(plain or every) if every else 1.0

    def _from_sibling(self, config: Config) -> float | None:
        """From the trials of another value of one slowing knob, all else alike: the longest such estimate."""
        kind, names = duration_kind(config), list(KNOBS)
        estimates = []
        for ran_kind, ran, seconds in self._kinds:
            differ = [i for i, (a, b) in enumerate(zip(kind, ran_kind, strict=True)) if a != b]
            if len(differ) == 1:
                estimates.append(self._scaled(config, names[differ[0]], ran, seconds))
        found = [estimate for estimate in estimates if estimate is not None]
        return max(found) if found else None

    def _scaled(self, config: Config, name: str, ran: Config, seconds: float) -> float | None:
        """The sibling's time over the rest of its configuration, scaled by the two values' prior extra times."""
        extra, ran_extra = self._time(name, config.get(name)) - 1, self._time(name, ran.get(name)) - 1
        if extra <= 0 or ran_extra <= 0:
            return None
        rest = self._plain * self.factor(config) / (extra + 1)  # the rest of the configuration, as the priors say
        ran_rest = self._plain * self.factor(ran) / (ran_extra + 1)
        return rest + max(seconds - ran_rest, 0.0) * extra / ran_extra


def duration_kind(config: Config) -> tuple:
    """Trials with the same kind take about as long (Knob.duration_group)."""
    return tuple(knob.duration_group(config.get(name)) for name, knob in KNOBS.items())


CUT_SHORT = (None, Outcome.BUDGET, Outcome.INTERRUPTED)  # a trial stopped before its end teaches no duration


def ended(history: Iterable[TrialRecord]) -> list[Ended]:
    """(configuration, seconds) of the trials that ran to their end, whatever their outcome, but those that compiled
    warm (warm_ended)."""
    return [(r.config, r.duration_s) for r in _ran_to_the_end(history) if not _warm(r)]


def warm_ended(history: Iterable[TrialRecord]) -> list[Ended]:
    """(configuration, seconds) of the trials that ran to their end and compiled warm."""
    return [(r.config, r.duration_s) for r in _ran_to_the_end(history) if _warm(r)]


def _ran_to_the_end(history: Iterable[TrialRecord]) -> list[TrialRecord]:
    return [r for r in history if r.duration_s is not None and r.outcome not in CUT_SHORT]


def _warm(record: TrialRecord) -> bool:
    return record.compiled is not None and record.compiled.compiled and record.compiled.cache == WARM
