"""The load levels of a serve trial, one at a time on one running server: each listed level, or a capacity bracket that
climbs by doubling while a level is sustained and then narrows by bisection (its decisions: figures/capacity.py).

Between levels the server is watched: one that fell over during a level refuses that level with the reason and ends
the levels there, those below kept (at the first level, there is none: the trial fails, worker/serve_trial.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from autotune.figures.capacity import Probe
from autotune.serving.latency import level_figures
from autotune.serving.load import Endpoint, RequestRecord, Requests, load_client, run_level, warm_up


class Watch(Protocol):
    """What the trial measures beside the load, level by level."""

    def begin(self) -> None:
        """A level starts: its own figures (peak memory) count from here."""

    def figures(self) -> dict[str, float]:
        """The figures of the level that just ended, measured beside the load."""

    def failure(self) -> str | None:
        """Why the server cannot take another level (it exited), or None."""


async def measure_levels(
    target: Endpoint,
    requests: Requests,
    mode: str,
    probe: Probe,
    watch: Watch,
    requests_at: Callable[[float], int],
    warmup: int,
) -> list[RequestRecord]:
    """Warm-up requests, then the levels the probe asks for (`requests_at(level)` requests each), each judged as it
    ends; every request sent, in order."""
    async with load_client(target) as client:
        records = await warm_up(client, target, requests, warmup)
    while (level := probe.next_size()) is not None:
        watch.begin()
        async with load_client(target) as client:  # each level on connections of its own
            sent = await run_level(client, target, requests, mode, level, requests_at(level))
        records += sent
        figures = level_figures(level, sent, probe.slo) | watch.figures()
        if (failure := watch.failure()) is not None:
            probe.record_failure(level, figures, failure)
            break
        probe.record(level, figures, detail=_first_error(sent))
    return records


def _first_error(sent: Sequence[RequestRecord]) -> str:
    error = next((record.error for record in sent if record.error), None)
    return f"the first failed: {error}" if error else ""
