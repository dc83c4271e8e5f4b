"""The replay harness: search strategies replayed against a measured grid, no model running; the grid's table answers
every trial. tests/strategy/test_strategy.py runs it on a synthetic grid; benchmarks/strategy/replay.py prints the
tables of docs/search-strategy.md with it.

For each strategy and seed, a search proposes configurations one by one, as `autotune search` does
(forbidden and already measured proposals are skipped at no cost); each launched configuration costs
the trial time the grid recorded for it (compile included), and adds its figures when it succeeded.
After every trial the harness computes the hypervolume of what was found, as a fraction of the
whole grid's. Strategies:

- random:   Optuna's RandomSampler;
- tpe:      Optuna's default sampler (TPESampler with its defaults);
- nsga2:    NSGAIISampler;
- gp:       GPSampler (Gaussian-process Bayesian optimisation; needs scipy, in the dev extra);
- autotune: the product's strategy (autotune/strategy/queue.py and study.make_sampler): reference,
            baseline, warm-up set, compositions and predicted changes first, then the sampler;
            configurations ruled out by earlier failures skipped.

Two variants show what the parts of autotune's strategy bring: autotune-warm-up-only (warm-up set, then the sampler)
and autotune-tpe-default (the full strategy, with Optuna's default TPE settings instead of autotune's).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna

from autotune.analysis.pareto import hypervolume, raw_losses, scaled
from autotune.figures.metrics import OBJECTIVES
from autotune.space import Config, SearchSpace, config_key
from autotune.strategy.durations import Durations
from autotune.strategy.queue import Situation, next_planned, next_queued, ruled_out, warm_up_set
from autotune.strategy.ranking import Planned
from autotune.study import make_sampler

optuna.logging.set_verbosity(optuna.logging.ERROR)
MAX_CONSECUTIVE_SKIPS = 50


@dataclass(frozen=True)
class Grid:
    """The measured table: every configuration's outcome, figures and trial time."""

    space: SearchSpace
    trials: dict[str, dict]  # config key -> {"config", "outcome", "metrics", "duration_s"}
    reference: Config
    baseline: Config
    device: str  # the profile's device type: "cpu" or "cuda"
    low: np.ndarray
    high: np.ndarray

    @classmethod
    def load(cls, path: Path) -> Grid:
        table = json.loads(path.read_text())
        ok = [trial["metrics"] for trial in table["trials"].values() if trial["outcome"] == "ok"]
        raw = raw_losses(ok)
        return cls(
            space=SearchSpace.from_json(table["space"]),
            trials=table["trials"],
            reference=table["reference"],
            baseline=table["baseline"],
            device=_device_type(table.get("profile")),
            low=raw.min(axis=0),
            high=raw.max(axis=0),
        )

    def points(self, keys: list[str]) -> np.ndarray:
        """Scaled loss vectors of the successful trials among `keys`, on the grid's own scale."""
        ok = [self.trials[key]["metrics"] for key in keys if self.trials[key]["outcome"] == "ok"]
        return scaled(raw_losses(ok), self.low, self.high) if ok else np.empty((0, 3))

    def hypervolume(self, keys: list[str]) -> float:
        return hypervolume(self.points(keys))


def _device_type(profile: object) -> str:
    """The grid's device type: grid.py stores the profile's name (older grids) or its settings."""
    if isinstance(profile, dict):
        return str(profile.get("kind", "cpu"))
    return "cpu" if profile in (None, "cpu") else "cuda"


@dataclass
class Curve:
    """After each launched trial: the hypervolume found (fraction of the grid's) and the time spent."""

    fractions: list[float]
    seconds: list[float]

    def at_trials(self, n: int) -> float:
        return self.fractions[min(n, len(self.fractions)) - 1]

    def time_to(self, fraction: float) -> float:
        return next((s for f, s in zip(self.fractions, self.seconds, strict=True) if f >= fraction), math.inf)

    def at_seconds(self, seconds: float) -> float:
        """The fraction found by trials that finished within this much trial time (0 before the first)."""
        done = [f for f, s in zip(self.fractions, self.seconds, strict=True) if s <= seconds]
        return done[-1] if done else 0.0


def replay(grid: Grid, strategy: str, seed: int, budget: int | None = None, enough: int | None = None) -> Curve:
    """One search of `strategy` against the grid, up to `budget` launched trials (default: all); with
    `enough`, it stops earlier, once that many trials ran and 95% of the grid's hypervolume is found (all
    that the table shows)."""
    sampler = SAMPLERS[strategy](seed)
    study = optuna.create_study(directions=[m.direction for m in OBJECTIVES], sampler=sampler)
    rng = random.Random(seed)
    guided = strategy.startswith("autotune")
    compose = strategy != "autotune-warm-up-only"
    plan: list[Planned] = warm_up_set(grid.space, grid.baseline) if guided else []
    if guided:
        for config in _unique([grid.reference, grid.baseline]):
            study.enqueue_trial(config)
    measured: list[str] = []
    history: list[tuple[int, Config, str]] = []
    whole = grid.hypervolume(list(grid.trials))
    curve = Curve([], [])
    spent = 0.0
    limit = budget or len(grid.trials)
    while len(measured) < limit:
        if enough is not None and len(measured) >= enough and curve.time_to(0.95) < math.inf:
            break
        picked = _next(study, grid, plan, measured, history, guided, compose, rng)
        if picked is None:
            break
        trial, config = picked
        entry = grid.trials[config_key(config)]
        measured.append(config_key(config))
        history.append((trial.number, config, entry["outcome"]))
        spent += entry["duration_s"]
        if entry["outcome"] == "ok":
            study.tell(trial, [entry["metrics"][m.name] for m in OBJECTIVES])
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        curve.fractions.append(grid.hypervolume(measured) / whole)
        curve.seconds.append(spent)
    return curve


def _next(
    study: optuna.Study,
    grid: Grid,
    plan: list[Planned],
    measured: list[str],
    history: list[tuple[int, Config, str]],
    guided: bool,
    compose: bool,
    rng: random.Random,
) -> tuple[optuna.Trial, Config] | None:
    """As TrialLoop._next_trial: planned configurations first, then the sampler; skips cost nothing."""
    taken = set(measured)
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    skip = lambda config: grid.space.violation(config) or ruled_out(config, history)  # noqa: E731
    if guided and not waiting:
        done = {key: (grid.trials[key]["config"], grid.trials[key]["metrics"]) for key in measured}
        done = {key: entry for key, entry in done.items() if grid.trials[key]["outcome"] == "ok"}
        if compose:
            ended = [(grid.trials[key]["config"], grid.trials[key]["duration_s"]) for key in measured]
            durations = Durations(ended, grid.baseline, grid.device)
            planned = next_queued(Situation(grid.space, grid.baseline, grid.device), plan, done, taken, skip, durations)
        else:
            planned = next_planned(plan, taken, skip)
        if planned is not None:
            study.enqueue_trial(planned.config)
    return sampled(study, grid, taken, history, guided, rng)


def sampled(
    study: optuna.Study,
    grid: Grid,
    taken: set[str],
    history: list[tuple[int, Config, str]],
    guided: bool,
    rng: random.Random,
) -> tuple[optuna.Trial, Config] | None:
    """The queued configuration, else the sampler's proposal: forbidden and measured ones skipped at no cost (and,
    `guided`, those earlier failures rule out); an untried one at random when the sampler keeps proposing them."""
    for _ in range(MAX_CONSECUTIVE_SKIPS):
        trial = study.ask()
        config = grid.space.suggest(trial)
        reason = grid.space.violation(config) or ("measured" if config_key(config) in taken else None)
        if reason is None and guided:
            reason = ruled_out(config, history)
        if reason is None:
            return trial, config
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    untried = [c for c in grid.space.configurations() if config_key(c) not in taken]
    untried = [c for c in untried if not (guided and ruled_out(c, history))]
    if not untried:
        return None
    study.enqueue_trial(rng.choice(untried))
    trial = study.ask()
    return trial, grid.space.suggest(trial)


def _unique(configs: list[Config]) -> list[Config]:
    return list({config_key(c): c for c in configs}.values())


SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "random": lambda seed: optuna.samplers.RandomSampler(seed=seed),
    "tpe": lambda seed: optuna.samplers.TPESampler(seed=seed),
    "nsga2": lambda seed: optuna.samplers.NSGAIISampler(seed=seed),
    "gp": lambda seed: optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False),
    "autotune": make_sampler,
    # variants that the choice of autotune's strategy was made from
    "autotune-warm-up-only": make_sampler,
    "autotune-tpe-default": lambda seed: optuna.samplers.TPESampler(seed=seed),
}


def compared_trials(curves: list[Curve]) -> int:
    return min(len(c.fractions) for c in curves)


def ahead_at_every_budget(grid: Grid, ours: list[Curve], theirs: list[Curve]) -> bool:
    """Mean hypervolume fraction of `ours` at least that of `theirs` after every number of trials that
    every curve reached."""
    n = compared_trials(ours + theirs)
    return all(
        statistics.fmean(c.fractions[t] for c in ours) >= statistics.fmean(c.fractions[t] for c in theirs)
        for t in range(n)
    )
