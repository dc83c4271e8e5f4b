"""The Pareto front and its hypervolume.

The front of a study is Optuna's own (`study.best_trials`: the non-dominated complete trials, feasible ones only when
the study has constraints), which an opened study hands out (autotune.study.opened). The front of any other set of
trials (the feasible trials of `autotune best`) uses the same test. For hypervolumes, each objective becomes a loss on
its own scale (metrics.Metric.loss: throughput negated, KL on a log scale), scaled to [0, 1] between given bounds, so
hypervolumes of different trial sets compare (Optuna's WFG). Every function takes the objectives it works on; the
default three when none are given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from autotune.figures.metrics import KL_DIVERGENCE, OBJECTIVES, Metric
from autotune.study import TrialRecord
from autotune.study.optuna_internals import compute_hypervolume, is_pareto_front

REFERENCE_MARGIN = 1.1  # just beyond the worst scaled loss, so points on the edge count


# ------------------------------------------------------------------------------------------- fronts


def non_dominated(trials: Sequence[TrialRecord], objectives: Sequence[Metric] = OBJECTIVES) -> set[int]:
    """The numbers of the trials no other of these dominates: Optuna's test behind `best_trials`."""
    if not trials:
        return set()
    values = [[metric.minimised(t.metrics[metric.name]) for metric in objectives] for t in trials]
    on_front = is_pareto_front(np.array(values, dtype=float))
    return {trial.number for trial, is_on in zip(trials, on_front, strict=True) if is_on}


# ------------------------------------------------------------------------------------ hypervolumes


def log_kl(kl: float) -> float:
    return KL_DIVERGENCE.on_scale(kl)


def raw_losses(figures: Sequence[Mapping[str, float]], objectives: Sequence[Metric] = OBJECTIVES) -> np.ndarray:
    """[trials, objectives]: each objective as a loss on its own scale (default: -throughput, memory, log10 KL)."""
    rows = [[metric.loss(f[metric.name]) for metric in objectives] for f in figures]
    return np.array(rows, dtype=float).reshape(-1, len(objectives))


def scaled(raw: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    span = np.where(high > low, high - low, 1.0)
    return (raw - low) / span


def scaled_losses(figures: Sequence[Mapping[str, float]], objectives: Sequence[Metric] = OBJECTIVES) -> np.ndarray:
    """Losses scaled to [0, 1] over these trials themselves."""
    raw = raw_losses(figures, objectives)
    if raw.size == 0:
        return raw
    return scaled(raw, raw.min(axis=0), raw.max(axis=0))


def hypervolume(points: np.ndarray) -> float:
    """Volume dominated by scaled loss vectors, up to REFERENCE_MARGIN on every axis."""
    if not len(points):
        return 0.0
    points = np.asarray(points, dtype=float)
    return compute_hypervolume(points, np.full(points.shape[1], REFERENCE_MARGIN))


def contributions(points: np.ndarray) -> np.ndarray:
    """Each point's exclusive share of the hypervolume: what removing it alone would lose (0 if dominated)."""
    whole = hypervolume(points)
    return np.array([whole - hypervolume(np.delete(points, i, axis=0)) for i in range(len(points))])
