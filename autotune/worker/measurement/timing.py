"""Repeat a measurement until it has both enough iterations and enough time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def repeat_until(
    run: Callable[[], T],
    min_iterations: int,
    min_seconds: float,
    max_iterations: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[T]:
    """Call `run` until it ran `min_iterations` times and `min_seconds` passed, or `max_iterations` times."""
    results: list[T] = []
    start = clock()
    while len(results) < max_iterations and (len(results) < min_iterations or clock() - start < min_seconds):
        results.append(run())
    return results
