"""What a configuration carries at its capacity, in the figures a capacity plan is made of: generated tokens/s per
GPU, tokens and requests per hour, and what a million tokens cost, each with the SLO it holds within.

A trial with a capacity (autotune/workloads/capacity.py) stores its probe's points. Its figures at capacity are the
chosen point's own where the point holds them (a serve level), else the trial's (a throughput trial reports those of
its chosen batch). Plain arithmetic over stored records, for the report's cards, `best`, `compare` and `history`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.figures.slo import describe_slo
from autotune.specs import WorkloadSpec
from autotune.study import StudySettings, TrialRecord
from autotune.workloads import KINDS
from autotune.workloads.capacity import Capacity, CapacityUnit, capacity_unit

# Generated tokens per second of the whole call or request, in the order a point or a trial may hold them: a batch's
# end-to-end figure, a serve level's output, a trial's decode throughput when it holds nothing else.
TOKENS_PER_S = ("e2e_throughput_tok_s", "output_tok_s", "throughput_tok_s")


@dataclass(frozen=True)
class SloTarget:
    """What a capacity is judged by: the latency bounds, and under load the share of requests that must meet them."""

    slo: dict[str, float]
    share: float | None = None  # None: a batch meets the SLO by its own percentiles

    @property
    def within(self) -> str:
        """ "within itl_p95<=6ms", "within ttft_p95<=300ms for 95% of requests", or "with no SLO"."""
        if not self.slo:
            return "with no SLO"
        share = f" for {self.share:.0%} of requests" if self.share is not None else ""
        return f"within {describe_slo(self.slo)}{share}"

    def differs(self, later: SloTarget) -> str | None:
        """Why figures at capacity under this target and under `later` do not compare; None when they do."""
        if self == later:
            return None
        return f"the earlier was searched {self.within}, the later {later.within}"


@dataclass(frozen=True)
class Terms:
    """What a study's figures at capacity hold under: its SLO, a request's generated tokens, its device and price."""

    target: SloTarget
    output_len: int
    device: str  # what the figures are per: GPU, or CPU for a study on the CPU profile
    price_per_hour: float | None  # of one device, the profile's

    @classmethod
    def of(cls, settings: StudySettings) -> Terms:
        workload = WorkloadSpec(**settings.workload)
        device = "GPU" if settings.profile.get("kind", "cuda") == "cuda" else "CPU"
        return cls(slo_target(workload), workload.output_len, device, settings.profile.get("price_per_hour"))


def slo_target(workload: WorkloadSpec) -> SloTarget:
    """The SLO a workload's capacities are judged by."""
    by_share = KINDS[workload.kind].probes == "load"  # a load level meets the SLO for a share of its requests
    return SloTarget(dict(workload.slo), workload.slo_share if by_share else None)


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
    if not record.complete or not record.capacity:
        return None
    stored = record.capacity
    unit = capacity_unit(stored.get("unit"))
    found = Capacity.from_json(stored)
    chosen = found.chosen
    target = SloTarget(found.slo, stored.get("slo_share", terms.target.share))
    sources = [chosen.figures, record.metrics] if chosen else []
    tokens = _first(sources, TOKENS_PER_S)
    requests = _first(sources, ("requests_per_s",))
    if requests is None and tokens is not None:
        requests = tokens / terms.output_len  # every request generates the workload's output length
    stopped = found.why_stopped(unit.name) if chosen else found.why_none(unit.name)
    return AtCapacity(
        unit,
        chosen.size if chosen else None,
        target,
        stopped,
        int(record.metrics.get("tp_ranks", 1)),
        terms.device,
        tokens,
        requests,
        _price(record, terms),
    )


def _first(sources: Sequence[Mapping[str, float]], names: Sequence[str]) -> float | None:
    """The first of `names` the first source holds, else the next source's."""
    for source in sources:
        for name in names:
            if source.get(name) is not None:
                return source[name]
    return None


def _price(record: TrialRecord, terms: Terms) -> float | None:
    """The hourly price the trial's own cost was computed with (`--price`, else the profile's), else the profile's."""
    cost, tokens = record.metrics.get("cost_per_million_tokens_usd"), record.metrics.get("e2e_throughput_tok_s")
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
