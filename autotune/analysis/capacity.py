"""What a configuration carries at its capacity, in the figures a capacity plan is made of: generated tokens/s per
GPU, tokens and requests per hour, and what a million tokens cost, each with the SLO it holds within.

A trial with a capacity (autotune/figures/capacity.py) stores its probe's points. Its figures at capacity are the
chosen point's own where the point holds them (a serve level), else the trial's (a throughput trial reports those of
its chosen batch). Plain arithmetic over stored records, for the report's cards, `best`, `compare` and `history`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.figures.capacity import CapacityUnit, SloTarget
from autotune.figures.metrics import (
    COST_PER_MILLION_TOKENS,
    E2E_THROUGHPUT,
    OUTPUT_TOK_S,
    REQUESTS_PER_S,
    THROUGHPUT,
    TP_RANKS,
)
from autotune.specs import WorkloadSpec
from autotune.study import TrialRecord
from autotune.study.opened import Terms
from autotune.workloads import KINDS, slo_target

# Generated tokens per second of the whole call or request, in the order a point or a trial may hold them: a batch's
# end-to-end figure, a serve level's output, a trial's decode throughput when it holds nothing else.
TOKENS_PER_S = (E2E_THROUGHPUT.name, OUTPUT_TOK_S, THROUGHPUT.name)


@dataclass(frozen=True)
class HeldAt:
    """Where a search's best figures hold, as its summary says it."""

    within: str  # "within itl_p95<=6ms" where the trials' figures are at their capacity; empty at one shape
    quality_too: bool  # the quality figures too (decoded at that batch), not only a serve trial's speed (one prompt)


def held_at(workload: WorkloadSpec) -> HeldAt:
    """Where the figures of a search of this workload hold: at each trial's capacity within the SLO, where it has one
    or probes one; the quality figures too where the kind forces them through the generation it timed."""
    within = slo_target(workload).within if workload.slo or workload.probes_capacity else ""
    return HeldAt(within, KINDS[workload.kind].times_generate)


@dataclass(frozen=True)
class AtCapacity:
    """A configuration's capacity and what one deployment of it carries there."""

    unit: CapacityUnit
    size: float | None  # the capacity: the largest size within the SLO; None where none met it
    target: SloTarget
    stopped: str  # why the probe stopped climbing, or why no size met the SLO
    devices: int  # GPUs one deployment takes (tensor parallelism)
    device: str
    tokens_per_s: float | None  # generated tokens/s of one deployment, all its devices
    requests_per_s: float | None
    price_per_hour: float | None  # of one device

    @property
    def where(self) -> str:
        """ "batch 16 within itl_p95<=6ms": the condition every figure here holds under."""
        size = self.unit.size_text(self.size) if self.size is not None else f"no {self.unit.name}"
        return f"{size} {self.target.within}"

    @property
    def tokens_per_s_per_device(self) -> float | None:
        return None if self.tokens_per_s is None else self.tokens_per_s / self.devices

    @property
    def tokens_per_hour(self) -> float | None:
        return None if self.tokens_per_s is None else self.tokens_per_s * 3600

    @property
    def requests_per_hour(self) -> float | None:
        return None if self.requests_per_s is None else self.requests_per_s * 3600

    @property
    def cost_per_million_tokens(self) -> float | None:
        """USD per million generated tokens: the price of every device of a deployment over what it generates."""
        if self.price_per_hour is None or not self.tokens_per_hour:
            return None
        return self.price_per_hour * self.devices / self.tokens_per_hour * 1e6

    def capacity_line(self) -> str:
        """ "capacity within itl_p95<=6ms: batch 16; batch 32 past the SLO: itl_p95 10.5 ms > 6 ms"."""
        if self.size is None:
            return f"no capacity {self.target.within}: {self.stopped}"
        return f"capacity {self.target.within}: {self.unit.size_text(self.size)}; {self.stopped}"

    def figures_line(self) -> str:
        """Per device, per hour and per million tokens, with the size and the SLO they hold at; empty without one."""
        if self.size is None or self.tokens_per_s_per_device is None:
            return ""
        parts = [f"{self.tokens_per_s_per_device:.4g} generated tok/s end to end per {self.device}"]
        if self.devices > 1:
            parts[0] += f" ({self.devices} {self.device}s, {self.tokens_per_s:.4g} tok/s in all)"
        hourly = f"{count(self.tokens_per_hour)} tokens"
        if self.requests_per_hour is not None:
            hourly += f" and {count(self.requests_per_hour)} requests"
        parts.append(f"{hourly} per hour")
        if (cost := self.cost_per_million_tokens) is not None:
            parts.append(f"${cost:.4g} per 1M generated tokens at ${self.price_per_hour:.2f} per {self.device}-hour")
        return f"at {self.where}: {', '.join(parts)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit.name,
            "capacity": self.size,
            "slo": self.target.slo,
            "slo_share": self.target.share,
            "within": self.target.within,
            "stopped": self.stopped,
            "devices": self.devices,
            "device": self.device,
            "generated_tok_s": self.tokens_per_s,
            "generated_tok_s_per_device": self.tokens_per_s_per_device,
            "tokens_per_hour": self.tokens_per_hour,
            "requests_per_hour": self.requests_per_hour,
            "price_per_device_hour_usd": self.price_per_hour,
            "cost_per_million_tokens_usd": self.cost_per_million_tokens,
        }


def at_capacity(record: TrialRecord, terms: Terms) -> AtCapacity | None:
    """The capacity of a complete trial that probed one, and its figures there; None for any other trial."""
    found = record.capacity
    if not record.complete or found is None:
        return None
    chosen = found.chosen
    target = SloTarget(found.slo, terms.target.share)
    sources = [chosen.figures, record.metrics] if chosen else []
    tokens = _first(sources, TOKENS_PER_S)
    requests = _first(sources, (REQUESTS_PER_S.name,))
    if requests is None and tokens is not None:
        requests = tokens / terms.output_len  # every request generates the workload's output length
    stopped = found.why_stopped() if chosen else found.why_none()
    return AtCapacity(
        found.unit,
        chosen.size if chosen else None,
        target,
        stopped,
        int(record.metrics.get(TP_RANKS, 1)),
        terms.device,
        tokens,
        requests,
        _price(record, terms),
    )


def capacities(records: Iterable[TrialRecord], terms: Terms) -> dict[int, AtCapacity]:
    """Trial number -> its capacity and its figures there, for the trials that probed one: computed once, read by
    every part of the report and by `best`."""
    return {record.number: found for record in records if (found := at_capacity(record, terms)) is not None}


def _first(sources: Sequence[Mapping[str, float]], names: Sequence[str]) -> float | None:
    """The first of `names` the first source holds, else the next source's."""
    for source in sources:
        for name in names:
            if source.get(name) is not None:
                return source[name]
    return None


def _price(record: TrialRecord, terms: Terms) -> float | None:
    """The hourly price the trial's own cost was computed with (`--price`, else the profile's), else the profile's."""
    cost, tokens = record.metrics.get(COST_PER_MILLION_TOKENS.name), record.metrics.get(E2E_THROUGHPUT.name)
    if cost and tokens:
        return round(cost * tokens * 3600 / 1e6, 6)  # the worker's cost_per_million_tokens, solved for the price
    return terms.price_per_hour


def count(value: float | None) -> str:
    """1234567 -> "1.23M", 4321 -> "4.32k": a figure per hour at a glance."""
    if value is None:
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"
