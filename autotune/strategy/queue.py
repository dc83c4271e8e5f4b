"""autotune's search strategy: what to measure before the sampler takes over, and in what order.

Chosen from benchmarks/strategy/replay.py, which replays strategies against exhaustively measured grids, and
from what the transformers guides recommend first (the knob handlers' priors, `Knob.expect`):

- the reference and the baseline (search/session.py queues them);
- the recommended stacks: for each of the study's objectives, the configuration the guides name first
  on this device (decode speed on a GPU: bf16 + static cache + compile; memory: 4-bit NF4 with bf16
  compute; latency: the compiled static cache, one prompt at a time; serving: continuous batching);
- then, in the order of what each is expected to add to the front per expected second of trial
  (strategy/forecast.py: priors until a trial measures the change, then the measurement):
  the warm-up set (the baseline with one knob changed, once for every value of every knob),
  compositions (for each trade-off between the objectives, the warm-up changes that served it,
  combined on the baseline) and predicted changes (one-knob changes of Pareto configurations).
  What is expected to lose on the study's first objective waits until the rest has run; a warm-up
  change is never dropped, only moved back;
- configurations that earlier failures rule out are skipped without being run: after an
  out-of-memory error, any configuration that differs from that one only by needing more memory
  (a wider dtype, lighter quantization, more tokens per batch) is skipped too;
- then the sampler (see study.make_sampler).
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from autotune.analysis.pareto import contributions, raw_losses, scaled, scaled_losses
from autotune.figures.metrics import KL_DIVERGENCE, OBJECTIVES, PEAK_MEMORY, THROUGHPUT, Metric
from autotune.process.results import Outcome
from autotune.space import KNOBS, Config, SearchSpace, config_key
from autotune.space.knobs import FLASH, RECIPES, DeviceType, Recipe
from autotune.strategy.changes import Changes, describe, fill, with_value
from autotune.strategy.durations import Durations
from autotune.strategy.forecast import Forecaster, Measured, family
from autotune.strategy.ranking import Planned, loses, rank
from autotune.workloads import KINDS


def warm_up_set(space: SearchSpace, baseline: Config) -> list[Planned]:
    """The baseline with one knob changed, for each value of each knob, in the space's order."""
    planned: dict[str, Planned] = {}
    for spec in space.knobs:
        for value in spec.values:
            if baseline.get(spec.name) == value:
                continue
            config = with_value(space, baseline, spec.name, value)
            if config is not None and config_key(config) not in planned and config != baseline:
                planned[config_key(config)] = Planned(config, f"warm-up: {spec.name}={value}")
    return list(planned.values())


# ------------------------------------------------------------------------------- recommended stacks


_FLASH_PACKAGES = {"flash_attention_3": "flash_attn_interface", "flash_attention_2": "flash_attn"}


def aims(objectives: Sequence[Metric], workload: str) -> list[str]:
    """The recipes a study's objectives call for, in the objectives' order (each workload kind says which)."""
    wanted: list[str] = []
    for metric in objectives:
        wanted += KINDS[workload].aims.get(family(metric) or "", ())
    return list(dict.fromkeys(wanted))


def recommended_stacks(
    space: SearchSpace, baseline: Config, objectives: Sequence[Metric], workload: str, device: DeviceType
) -> list[Planned]:
    """The stacks the guides recommend for these objectives, each as it fits this space, unique, not the baseline."""
    planned: dict[str, Planned] = {}
    for aim in aims(objectives, workload):
        recipe = RECIPES[aim]
        config = _realise(space, baseline, recipe, device)
        if config != baseline and config_key(config) not in planned:
            planned[config_key(config)] = Planned(config, f"recommended for {aim}: {recipe.title} ({recipe.source})")
    return list(planned.values())


def _realise(space: SearchSpace, baseline: Config, recipe: Recipe, device: DeviceType) -> Config:
    """The baseline with each of the recipe's knobs set to its first value that fits with those set before."""
    config, fixed = dict(baseline), {}
    for name, preferred in recipe.settings:
        if name in recipe.gpu_only and device != "cuda":
            continue
        for value in _installed_flash() if preferred == (FLASH,) else preferred:
            changed = with_value(space, config, name, value) if name in space.knob_names() else None
            if changed is not None and all(changed.get(k) == v for k, v in fixed.items()):
                config, fixed = changed, {**fixed, name: value}
                break
    return config


def _installed_flash() -> tuple[str, ...]:
    """Flash attention values whose package is installed here, best first (the space prunes by hardware)."""
    return tuple(value for value, package in _FLASH_PACKAGES.items() if importlib.util.find_spec(package) is not None)


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
        candidate = fill(space, {**{k: v for k, v in config.items() if k not in change}, **_pick(changed, change)})
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


def promising_neighbours(forecaster: Forecaster, front: Sequence[Config]) -> list[Planned]:
    """One-knob changes of the front's configurations, each with why it might extend the front; unscored."""
    planned: dict[str, Planned] = {}
    space, baseline = forecaster.space, forecaster.baseline
    for anchor in front:
        for spec in space.knobs:
            for value in spec.values:
                if anchor.get(spec.name) == value:
                    continue
                config = forecaster.changes.with_value(anchor, spec.name, value)
                if config is not None and config_key(config) not in planned:
                    where = describe(anchor, baseline)
                    why = f"predicted to extend the front: {spec.name}={value} on the front's {where}"
                    planned[config_key(config)] = Planned(config, why)
    return list(planned.values())


@dataclass(frozen=True)
class Situation:
    """What the strategy plans from: the space, the anchors, the study's aims, and what ran so far."""

    space: SearchSpace
    baseline: Config
    device: DeviceType = "cpu"
    objectives: Sequence[Metric] = OBJECTIVES
    workload: str = "throughput"

    def stacks(self) -> list[Planned]:
        return recommended_stacks(self.space, self.baseline, self.objectives, self.workload, self.device)

    @cached_property
    def changes(self) -> Changes:
        return Changes(self.space)


def next_queued(
    situation: Situation,
    warm_up: list[Planned],
    measured: Mapping[str, Measured],
    taken: set[str],
    skip: Callable[[Config], object],
    durations: Durations | None = None,
    seconds_left: float | None = None,
    passed_over: Callable[[Planned, float], None] = lambda planned, seconds: None,
) -> Planned | None:
    """What the strategy queues next: the recommended stacks, then warm-up changes, compositions and predicted
    changes ranked (see `rank`), then nothing (the sampler takes over). `measured` maps keys of complete trials to
    (config, figures); `durations` says how long trials take (strategy/durations.py). A trial that may not finish in
    `seconds_left` (its at-most duration) is passed over for the next that fits, in the same order: `passed_over`
    hears of it, with its at-most seconds."""
    durations = durations or Durations(baseline=situation.baseline, device=situation.device)
    for planned in _in_order(situation, warm_up, measured, taken, skip, durations):
        at_most = durations.of(planned.config).at_most
        if seconds_left is None or at_most is None or at_most <= seconds_left:
            return planned
        passed_over(planned, at_most)
    return None


def _in_order(
    situation: Situation,
    warm_up: list[Planned],
    measured: Mapping[str, Measured],
    taken: set[str],
    skip: Callable[[Config], object],
    durations: Durations,
) -> Iterator[Planned]:
    """The stacks that run first, then the ranking (computed only once every stack is taken or passed over)."""
    space, baseline, objectives = situation.space, situation.baseline, situation.objectives
    forecaster = Forecaster(space, baseline, situation.device, measured, durations, objectives, situation.changes)
    first, waiting = _stacks_first(situation, forecaster)
    yield from (p for p in first if config_key(p.config) not in taken and not skip(p.config))
    figures = {key: entry[1] for key, entry in measured.items()}
    front = [measured[key][0] for key in _front_keys(measured, objectives)]
    candidates = itertools.chain(
        ((planned, True) for planned in waiting),
        ((planned, True) for planned in warm_up),
        ((planned, False) for planned in compositions(space, baseline, warm_up, figures, objectives)),
        ((planned, False) for planned in promising_neighbours(forecaster, front)),
    )
    fresh = _unique(c for c in candidates if config_key(c[0].config) not in taken and not skip(c[0].config))
    siblings = _lead_siblings(situation.stacks(), warm_up, waiting, baseline)
    yield from (s.planned for s in rank(forecaster, fresh, siblings, frozenset(config_key(s.config) for s in waiting)))


def _stacks_first(situation: Situation, forecaster: Forecaster) -> tuple[list[Planned], list[Planned]]:
    """The recommended stacks that run first, and those that wait in the ranking: a stack expected to lose on the
    study's first objective (4-bit weights, where speed comes first) waits with what else loses on it."""
    stacks = situation.stacks()
    baseline = forecaster.forecast(situation.baseline).figures  # type: ignore[union-attr] - never None
    lead = situation.objectives[0]
    losing = [s for s in stacks if loses(lead, forecaster.forecast(s.config).figures, baseline)]  # type: ignore[union-attr]
    return [s for s in stacks if s not in losing], losing


def _lead_siblings(
    stacks: list[Planned], warm_up: list[Planned], waiting: list[Planned], baseline: Config
) -> frozenset[str]:
    """Keys of the warm-up changes that only touch knobs the first objective's stacks set (the other compile modes,
    another half precision, another flash attention): they run before the stacks that wait (Tier)."""
    knobs = {name for stack in stacks if stack not in waiting for name in _changed(stack.config, baseline)}
    return frozenset(config_key(p.config) for p in warm_up if _changed(p.config, baseline) <= knobs)


def _changed(config: Config, baseline: Config) -> set[str]:
    return {name for name in config.keys() | baseline.keys() if config.get(name) != baseline.get(name)}


def _unique(candidates: Iterable[tuple[Planned, bool]]) -> list[tuple[Planned, bool]]:
    """The first of each configuration, a warm-up change whenever one of them is."""
    found: dict[str, tuple[Planned, bool]] = {}
    for planned, warm_up in candidates:
        key = config_key(planned.config)
        if key not in found:
            found[key] = (planned, warm_up)
    return list(found.values())


def _front_keys(measured: Mapping[str, Measured], objectives: Sequence[Metric]) -> list[str]:
    keys = list(measured)
    if not keys:
        return []
    raw = raw_losses([figures for _, figures in measured.values()], objectives)
    shares = contributions(scaled(raw, raw.min(axis=0), raw.max(axis=0)))
    return [keys[i] for i in np.flatnonzero(shares > 0)]
