"""autotune's search strategy: what to measure before the sampler takes over, and what to skip.

Chosen from benchmarks/replay.py, which replays strategies against an exhaustively measured grid:

- a warm-up set after the reference and the baseline: the baseline with one knob changed, once for
  every value of every knob, cheapest first. It maps each knob's effect on every objective;
- compositions: for each trade-off between the objectives, the warm-up changes that served it,
  combined on the baseline (fastest dtype + compiling + fastest attention, say);
- predicted changes: one-knob changes of Pareto configurations, each predicted from the warm-up's
  trial that made the same change to the baseline, run while a prediction would extend the front,
  the largest expected gain first;
- configurations that earlier failures rule out are skipped without being run: after an
  out-of-memory error, any configuration that differs from that one only by needing more memory
  (a wider dtype, lighter quantization, more tokens per batch) is skipped too;
- then the sampler (see study.make_sampler).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from autotune.analysis.pareto import contributions, hypervolume, raw_losses, scaled, scaled_losses
from autotune.figures.metrics import KL_DIVERGENCE, OBJECTIVES, PEAK_MEMORY, THROUGHPUT, Metric
from autotune.process.results import Outcome
from autotune.space import KNOBS, Config, SearchSpace, config_key

Measured = tuple[Config, Mapping[str, float]]  # a complete trial's configuration and figures


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
    """A rough order of trial durations, the sum of the knobs' costs (compiling is the slowest)."""
    return sum(KNOBS[name].cost(value) for name, value in config.items() if name in KNOBS)


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


# How the trade-offs name an objective ("the warm-up's best changes for throughput and quality").
TRADE_OFF_NAMES = {THROUGHPUT.name: "throughput", PEAK_MEMORY.name: "memory", KL_DIVERGENCE.name: "quality"}


def trade_offs(objectives: Sequence[Metric] = OBJECTIVES) -> list[tuple[str, np.ndarray]]:
    """Each objective alone, each pair, ..., all of them: a label and the weights of the scaled losses."""
    names = [TRADE_OFF_NAMES.get(metric.name, metric.heading) for metric in objectives]
    chosen = []
    for size in range(1, len(objectives) + 1):
        for subset in itertools.combinations(range(len(objectives)), size):
            label = " and ".join(names[i] for i in subset)
            if size == len(objectives) > 2:
                label = "all three" if size == 3 else f"all {size}"
            chosen.append((label, np.array([1.0 if i in subset else 0.0 for i in range(len(objectives))])))
    return chosen


def compositions(
    space: SearchSpace,
    baseline: Config,
    warm_up: list[Planned],
    measured: Mapping[str, Mapping[str, float]],
    objectives: Sequence[Metric] = OBJECTIVES,
) -> list[Planned]:
    """For each trade-off, the baseline with the warm-up changes that served it, best first.

    A warm-up trial changed one knob of the baseline (and what that knob needs); it served a
    trade-off when its weighted losses beat the baseline's. Changes are applied greedily, best first,
    skipping one that touches a knob already changed or that the space's rules forbid.
    `measured` maps configuration keys to the figures of complete trials.
    """
    base = measured.get(config_key(baseline))
    tried = [p.config for p in warm_up if config_key(p.config) in measured]
    if base is None or not tried:
        return []
    losses = scaled_losses([base] + [measured[config_key(config)] for config in tried], objectives)
    planned: dict[str, Planned] = {}
    for label, weights in trade_offs(objectives):
        scores = losses @ weights
        helpful = sorted((score, i) for i, score in enumerate(scores[1:]) if score < scores[0])
        config = _combine(space, baseline, [tried[i] for _, i in helpful])
        if config != baseline and config_key(config) not in planned:
            planned[config_key(config)] = Planned(config, f"composed: the warm-up's best changes for {label}")
    return list(planned.values())


def _combine(space: SearchSpace, baseline: Config, changed_configs: list[Config]) -> Config:
    """The baseline with each configuration's changes applied in turn, when they fit with those before."""
    config, touched = dict(baseline), set()
    for changed in changed_configs:
        change = {name for name in baseline.keys() | changed.keys() if baseline.get(name) != changed.get(name)}
        if change & touched:
            continue
        candidate = _fill(space, {**{k: v for k, v in config.items() if k not in change}, **_pick(changed, change)})
        if space.violation(candidate) is None:
            config, touched = candidate, touched | change
    return config


def _pick(config: Config, names: set[str]) -> Config:
    return {name: value for name, value in config.items() if name in names}


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
        knob = KNOBS.get(name)
        if knob is not None and knob.orders_memory():
            rank, other_rank = knob.memory_rank(config[name]), knob.memory_rank(other[name])
            if rank is None or other_rank is None or rank < other_rank:
                return False
        elif config[name] != other[name]:
            return False
    return True


def promising_neighbours(
    space: SearchSpace, baseline: Config, measured: Mapping[str, Measured], objectives: Sequence[Metric] = OBJECTIVES
) -> list[Planned]:
    """One-knob changes of Pareto configurations that the warm-up predicts would add to the front.

    A change's effect is read off the warm-up, which made the same change to the baseline: each
    objective scales by the ratio it showed there (KL too: a shift on its log scale).
    Sorted by the hypervolume the prediction would add, largest first; changes predicted to add
    nothing are left out.
    """
    keys = list(measured)
    if not keys:
        return []
    raw = raw_losses([figures for _, figures in measured.values()], objectives)
    ranked: dict[str, tuple[float, Planned]] = {}
    for i in np.flatnonzero(contributions(scaled(raw, raw.min(axis=0), raw.max(axis=0))) > 0):
        anchor, figures = measured[keys[i]]
        for name, value, config in _one_knob_changes(space, anchor):
            effect = _effect(space, baseline, measured, name, anchor.get(name), value, objectives)
            key = config_key(config)
            if effect is None or key in measured or not np.all(np.isfinite(_logs(figures, objectives))):
                continue
            gain = _hypervolume_gain(raw, _raw_from_logs(_logs(figures, objectives) + effect, objectives))
            if gain > max(GAIN_FLOOR, ranked.get(key, (0.0, None))[0]):
                why = f"predicted to extend the front: {name}={value} on the front's {_describe(anchor, baseline)}"
                ranked[key] = (gain, Planned(config, why))
    return [planned for _, planned in sorted(ranked.values(), key=lambda item: -item[0])]


def _hypervolume_gain(raw: np.ndarray, candidate: np.ndarray) -> float:
    """Hypervolume one more point adds, all losses scaled to the bounds of the set with it."""
    both = np.vstack([raw, candidate])
    low, high = both.min(axis=0), both.max(axis=0)
    return hypervolume(scaled(both, low, high)) - hypervolume(scaled(raw, low, high))


GAIN_FLOOR = 1e-9


def _one_knob_changes(space: SearchSpace, config: Config) -> Iterable[tuple[str, str | int, Config]]:
    for spec in space.knobs:
        for value in spec.values:
            if config.get(spec.name) != value and (changed := _with_value(space, config, spec.name, value)):
                yield spec.name, value, changed


def _effect(
    space: SearchSpace,
    baseline: Config,
    measured: Mapping[str, Measured],
    name: str,
    old: object,
    new: object,
    objectives: Sequence[Metric] = OBJECTIVES,
) -> np.ndarray | None:
    """Log-figure difference between the baseline with `name` at `new` and at `old`, when both were measured."""
    before, after = (_baseline_with(space, baseline, measured, name, value) for value in (old, new))
    if before is None or after is None:
        return None
    effect = _logs(after, objectives) - _logs(before, objectives)
    return effect if np.all(np.isfinite(effect)) else None  # a zero figure (no goodput) has no ratio


def _baseline_with(
    space: SearchSpace, baseline: Config, measured: Mapping[str, Measured], name: str, value: object
) -> Mapping[str, float] | None:
    if baseline.get(name) == value:
        config: Config | None = baseline
    else:
        config = _with_value(space, baseline, name, value) if value is not None else None
    entry = measured.get(config_key(config)) if config is not None else None
    return entry[1] if entry is not None else None


def _logs(figures: Mapping[str, float], objectives: Sequence[Metric] = OBJECTIVES) -> np.ndarray:
    """Each objective on the scale where a knob's effect is roughly additive: log of the figure (log throughput,
    log memory), or the log10 it is compared on already (KL); NaN for a figure that is not positive."""
    raw = raw_losses([figures], objectives)[0]
    return np.array([_log_of(metric, loss) for metric, loss in zip(objectives, raw, strict=True)])


def _log_of(metric: Metric, loss: float) -> float:
    if metric.log_floor:
        return loss
    value = abs(loss)  # the figure itself: losses of maximised figures are negated
    return math.log(value) if value > 0 else math.nan


def _raw_from_logs(logs: np.ndarray, objectives: Sequence[Metric] = OBJECTIVES) -> np.ndarray:
    raw = [
        log if metric.log_floor else math.exp(log) * (-1 if metric.direction == "maximize" else 1)
        for metric, log in zip(objectives, logs, strict=True)
    ]
    return np.array([raw])


def _describe(config: Config, baseline: Config) -> str:
    changed = [f"{name}={value}" for name, value in config.items() if baseline.get(name) != value]
    return ", ".join(changed) or "baseline"


def next_queued(
    space: SearchSpace,
    baseline: Config,
    warm_up: list[Planned],
    measured: Mapping[str, Measured],
    taken: set[str],
    skip: Callable[[Config], object],
    objectives: Sequence[Metric] = OBJECTIVES,
) -> Planned | None:
    """What the strategy queues next: the warm-up set, its compositions, changes predicted to extend the front, then
    nothing (the sampler takes over). `measured` maps keys of complete trials to (config, figures)."""
    figures = {key: entry[1] for key, entry in measured.items()}
    for plan in (
        lambda: warm_up,
        lambda: compositions(space, baseline, warm_up, figures, objectives),
        lambda: promising_neighbours(space, baseline, measured, objectives),
    ):
        planned = next_planned(plan(), taken, skip)
        if planned is not None:
            return planned
    return None
