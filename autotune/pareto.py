"""The three objectives as losses on a common scale, and the hypervolume of a set of trials.

Throughput (maximised) becomes its negative, KL goes on a log scale, and each loss is scaled to
[0, 1] between given bounds, so hypervolumes of different trial sets compare (Optuna's WFG).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from optuna._hypervolume import compute_hypervolume  # no public API for it in Optuna 5

from autotune.metrics import KL_DIVERGENCE, PEAK_MEMORY, THROUGHPUT

KL_FLOOR = 1e-6  # the reference's KL is 0; log scales use log10(max(KL, floor))
REFERENCE_POINT = np.full(3, 1.1)  # just beyond the worst scaled loss, so points on the edge count


def log_kl(kl: float) -> float:
    return math.log10(max(kl, KL_FLOOR))


def raw_losses(figures: Sequence[Mapping[str, float]]) -> np.ndarray:
    """[trials, 3]: -throughput, peak memory, log10 KL."""
    rows = [[-f[THROUGHPUT.name], f[PEAK_MEMORY.name], log_kl(f[KL_DIVERGENCE.name])] for f in figures]
    return np.array(rows, dtype=float).reshape(-1, 3)


def scaled(raw: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    span = np.where(high > low, high - low, 1.0)
    return (raw - low) / span


def scaled_losses(figures: Sequence[Mapping[str, float]]) -> np.ndarray:
    """Losses scaled to [0, 1] over these trials themselves."""
    raw = raw_losses(figures)
    if raw.size == 0:
        return raw
    return scaled(raw, raw.min(axis=0), raw.max(axis=0))


def hypervolume(points: np.ndarray) -> float:
    """Volume dominated by scaled loss vectors, up to REFERENCE_POINT."""
    return float(compute_hypervolume(np.asarray(points, dtype=float), REFERENCE_POINT)) if len(points) else 0.0


def contributions(points: np.ndarray) -> np.ndarray:
    """Each point's exclusive share of the hypervolume: what removing it alone would lose (0 if dominated)."""
    whole = hypervolume(points)
    return np.array([whole - hypervolume(np.delete(points, i, axis=0)) for i in range(len(points))])
