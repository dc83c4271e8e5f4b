"""Summaries of repeated measurements."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    p50: float
    p95: float
    stdev: float
    cv: float  # coefficient of variation: stdev / mean

    @classmethod
    def of(cls, values: list[float]) -> Summary:
        if not values:
            raise ValueError("no values to summarise")
        ordered = sorted(values)
        mean = statistics.fmean(ordered)
        stdev = statistics.stdev(ordered) if len(ordered) > 1 else 0.0
        return cls(
            n=len(ordered),
            mean=mean,
            p50=percentile(ordered, 50),
            p95=percentile(ordered, 95),
            stdev=stdev,
            cv=stdev / mean if mean else math.inf,
        )

    def to_json(self) -> dict[str, float]:
        return asdict(self)


def percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method), on sorted values."""
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
