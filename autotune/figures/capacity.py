"""Capacity: the largest batch, or request rate, that a configuration sustains within a latency target (the SLO) and
within the memory it may use.

A probe measures points in ascending order and stops at the first one refused: past the SLO, out of memory, the
server fallen over, or predicted not to fit from the memory the smaller points took (that one is skipped, never run).
A probe of load levels then narrows the bracket between the last point that met the SLO and the first refused, by
bisection. A batch meets the SLO by its latency percentiles; a load level by the share of its requests that met it.
The capacity is the largest point that met the SLO; a configuration that met it nowhere has none, and says why.

Pure arithmetic, no torch: the trial worker runs the probe, the forecast counts its points.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from autotune.errors import UserError
from autotune.figures.metrics import ERRORS, GOODPUT, PEAK_MEMORY_BYTES, REQUESTS, SLO_SHARE, THROUGHPUT
from autotune.figures.slo import describe_slo, slo_misses
from autotune.units import format_bytes

# met the SLO; refused: past it, out of memory, over the memory (measured or predicted), the server failed (serve)
Verdict = Literal["met", "slo", "oom", "memory", "failed"]
REFUSED_WHY = {
    "slo": "past the SLO",
    "oom": "out of memory",
    "memory": "over the memory",
    "failed": "the server failed",
}
BATCH_FORM = "a number (8), a range searched by doubling (1-128), or a list (1,8,32)"
MOST_BATCH = 4096


def parse_batch_sizes(text: str) -> list[int]:
    """`8` -> [8]; `1-128` -> [1, 2, 4, ..., 128]; `1,8,32` -> [1, 8, 32]. UserError for anything else."""
    text = text.strip()
    try:
        if "-" in text:
            low, high = (int(part) for part in text.split("-", 1))
            sizes = doubling(low, high) if 1 <= low <= high else []
        else:
            sizes = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise UserError(f"--batch-size {text!r} is not a batch size: write {BATCH_FORM}") from None
    if not sizes or sizes[0] < 1 or sizes[-1] > MOST_BATCH:
        raise UserError(f"--batch-size {text!r}: batch sizes go from 1 to {MOST_BATCH}; write {BATCH_FORM}")
    return sizes


def doubling(low: int, high: int) -> list[int]:
    """low, 2 low, 4 low, ... and high itself."""
    sizes = [low * 2**step for step in range(int(math.log2(high / low)) + 1)]
    return sizes if sizes[-1] == high else [*sizes, high]


@dataclass(frozen=True)
class Point:
    """One measured (or skipped) point of a probe: its size (a batch, or a rate), its figures, its verdict."""

    size: float
    verdict: Verdict
    figures: dict[str, float] = field(default_factory=dict)
    reason: str = ""  # why it was refused

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "verdict": self.verdict, "figures": self.figures, "reason": self.reason}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Point:
        return cls(data["size"], data["verdict"], dict(data.get("figures", {})), data.get("reason", ""))


def largest_met(points: Iterable[Point]) -> Point | None:
    """The largest point that met the SLO: a probe's capacity; None where no point met it."""
    return max((point for point in points if point.verdict == "met"), key=lambda point: point.size, default=None)


def bisections(requests_per_level: int) -> int:
    """How many times a load bracket is halved: until its step is under 1/sqrt(n) of the rate, the spread of the rate
    that n Poisson arrivals realise (25% at 16 requests: 2 bisections). A finer step is beyond what one level of n
    requests can tell apart."""
    return int(math.log2(max(requests_per_level, 1)) // 2)


def share_misses(figures: dict[str, float], share: float) -> list[str]:
    """Why a load level is not sustained: too few of its requests met the SLO ("81% of requests within it < 95%"),
    and how many failed."""
    within, sent = figures.get(SLO_SHARE, 0.0), figures.get(REQUESTS, 0.0)
    if within >= share:
        return []
    misses = [f"{round(within * sent):g} of {sent:g} requests within it ({within:.1%}) < {share:.0%}"]
    if figures.get(ERRORS.name):
        misses.append(f"{figures[ERRORS.name]:g} of {figures.get(REQUESTS, 0):g} requests failed")
    return misses


@dataclass
class Probe:
    """Which size to measure next, from the points measured so far.

    `sizes`: the ascending sizes to try (a batch ladder); with `refine` > 0, the bracket between the last size that
    met the SLO and the first refused is bisected that many times (rates). `memory_limit` (bytes): a size whose
    peak memory, extrapolated from the last two measured points, exceeds it is skipped as not fitting. `share`: a
    point meets the SLO when that share of its requests met it (figure `slo_share`: load levels), not by its latency
    percentiles. `every`: each size is measured whatever the verdicts (a fixed list of load levels).
    """

    sizes: list[float]
    slo: dict[str, float]
    memory_limit: float | None = None
    refine: int = 0
    whole: bool = True  # sizes are whole numbers (batches), not rates
    share: float | None = None
    every: bool = False
    points: list[Point] = field(default_factory=list)

    def next_size(self) -> float | None:
        """The next size to measure, or None when the probe is over."""
        refused = self.first_refused
        if refused is None or self.every:
            tried = {point.size for point in self.points}
            return next((size for size in self.sizes if size not in tried), None)
        return self._bisect(refused)

    def _bisect(self, refused: Point) -> float | None:
        met = self.chosen
        if met is None or self._bisections >= self.refine or refused.verdict in ("memory", "failed"):
            return None
        middle = (met.size + refused.size) / 2
        middle = math.floor(middle) if self.whole else round(middle, 3)
        return middle if met.size < middle < refused.size else None

    @property
    def _bisections(self) -> int:
        return sum(1 for point in self.points if point.size not in self.sizes)

    def predicted_peak(self, size: float) -> float | None:
        """Peak memory at `size`, on the line through the two largest measured points below it; None without two."""
        measured = sorted(
            (p for p in self.points if PEAK_MEMORY_BYTES in p.figures and p.size < size), key=lambda p: p.size
        )
        if len(measured) < 2:
            return None
        (x0, y0), (x1, y1) = [(p.size, p.figures[PEAK_MEMORY_BYTES]) for p in measured[-2:]]
        return y1 + (y1 - y0) / (x1 - x0) * (size - x1)

    def too_big(self, size: float) -> Point | None:
        """The skipped point, when `size` is predicted not to fit in the memory limit; None when it may run."""
        predicted = self.predicted_peak(size)
        if self.memory_limit is None or predicted is None or predicted <= self.memory_limit:
            return None
        why = f"predicted peak {format_bytes(predicted)} > {format_bytes(self.memory_limit)}, not run"
        return Point(size, "memory", reason=why)

    def record(self, size: float, figures: dict[str, float], detail: str = "") -> Point:
        """Judge a measured point: refused when its peak memory is above the limit, or when it misses the SLO;
        `detail` (the first failed request's error) follows the reason of a refusal."""
        peak = figures.get(PEAK_MEMORY_BYTES)
        if self.memory_limit is not None and peak is not None and peak > self.memory_limit:
            why = f"peak {format_bytes(peak)} > {format_bytes(self.memory_limit)}"
            return self.add(Point(size, "memory", figures, why))
        misses = slo_misses(figures, self.slo) if self.share is None else share_misses(figures, self.share)
        reason = "; ".join([*misses, detail] if detail else misses)
        point = Point(size, "slo", figures, reason) if misses else Point(size, "met", figures)
        return self.add(point)

    def record_failure(self, size: float, figures: dict[str, float], reason: str) -> Point:
        """The server fell over during this point: the end of the bracket, the points below kept."""
        return self.add(Point(size, "failed", figures, reason[:300]))

    def record_oom(self, size: float, message: str) -> Point:
        return self.add(Point(size, "oom", reason=message.splitlines()[0][:300] if message else "out of memory"))

    def add(self, point: Point) -> Point:
        self.points.append(point)
        self.points.sort(key=lambda p: p.size)
        return point

    @property
    def chosen(self) -> Point | None:
        """The largest point that met the SLO."""
        return largest_met(self.points)

    @property
    def first_refused(self) -> Point | None:
        return min((p for p in self.points if p.verdict != "met"), key=lambda p: p.size, default=None)

    def capacity(self, unit: str = "batch") -> Capacity:
        """What the probe found, in the unit it climbed (batch, rate, concurrency)."""
        points = list(self.points)
        return Capacity(capacity_unit(unit), SloTarget(dict(self.slo), self.share), points, stop_of(points))


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


LARGEST = "largest"  # a probe that tried every size it had to, each one met: it stopped at the largest


@dataclass(frozen=True)
class Stop:
    """What ended a probe's climb: the size refused above its capacity, `why` its verdict; or `why` LARGEST, the
    largest size it had to try, every one of them met."""

    size: float
    why: str  # a refusal's Verdict, or LARGEST

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "why": self.why}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stop:
        return cls(data["size"], data["why"])


def stop_of(points: list[Point]) -> Stop | None:
    """What stopped a probe whose points these are (ascending): the smallest refused above the largest met, else the
    largest tried; None when no point was measured."""
    chosen = largest_met(points)
    above = chosen.size if chosen else -math.inf
    refused = min((p for p in points if p.verdict != "met" and p.size > above), key=lambda p: p.size, default=None)
    if refused is not None:
        return Stop(refused.size, refused.verdict)
    return Stop(max(p.size for p in points), LARGEST) if points else None


@dataclass(frozen=True)
class Capacity:
    """What a probe found, as a trial stores it: the unit it climbed, the target its points were judged by, its
    points in ascending order, and what stopped it. Its words are made here, when it is shown."""

    unit: CapacityUnit
    target: SloTarget
    points: list[Point]
    stopped: Stop | None  # None: no point was measured

    @property
    def slo(self) -> dict[str, float]:
        return self.target.slo

    @property
    def chosen(self) -> Point | None:
        """The largest point that met the SLO: the capacity."""
        return largest_met(self.points)

    @property
    def refused(self) -> Point | None:
        """The point refused above the chosen one: why the probe stopped climbing (None: none was refused)."""
        stop = self.stopped
        if stop is None or stop.why == LARGEST:
            return None
        return next((p for p in self.points if p.size == stop.size), None)

    def why_stopped(self) -> str:
        """ "batch 64 past the SLO: itl_p95 6.2 ms > 5 ms", or that the probe reached its largest size."""
        stop, name = self.stopped, self.unit.name
        if stop is None:
            return ""
        if stop.why == LARGEST:
            return f"every {name} tried met the SLO (the largest: {_size(stop.size)})"
        reason = self.refused.reason if self.refused else ""
        return f"{name} {_size(stop.size)} {REFUSED_WHY[stop.why]}: {reason}"

    def why_none(self) -> str:
        """Why no point met the SLO (a configuration with no capacity is off the front, with this reason)."""
        if self.stopped is None:
            return f"no {self.unit.name} was measured"
        return f"meets the SLO at no {self.unit.name}: {self.why_stopped()}"

    def found(self) -> str:
        """What the probe found, in one line: "batch 16 is the largest within the SLO; batch 32 past the SLO: ...",
        "rate 12 is the highest sustained (95% of requests within the SLO); rate 14 ...", or why none met it."""
        chosen = self.chosen
        if chosen is None:
            return self.why_none()
        at = f"{self.unit.name} {_size(chosen.size)}"
        share = self.target.share
        if share is None:
            return f"{at} is the largest within the SLO; {self.why_stopped()}"
        return f"{at} is the highest sustained ({share:.0%} of requests within the SLO); {self.why_stopped()}"

    def to_json(self) -> dict[str, Any]:
        """As a trial stores it (TaskDetails.capacity, the trial's user attribute `capacity`)."""
        share = {} if self.target.share is None else {"share": self.target.share}
        stopped = self.stopped.to_json() if self.stopped else None
        points = [point.to_json() for point in self.points]
        return {"unit": self.unit.name, "slo": dict(self.slo), **share, "points": points, "stopped": stopped}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Capacity:
        """From the form to_json writes (older stored forms: autotune.study.migrations)."""
        stopped = Stop.from_json(data["stopped"]) if data.get("stopped") else None
        target = SloTarget(dict(data.get("slo", {})), data.get("share"))
        return cls(capacity_unit(data["unit"]), target, [Point.from_json(p) for p in data.get("points", [])], stopped)

    def shown(self) -> dict[str, Any]:
        """As `autotune measure --json` shows it: its SLO, points and unit, the share of a load, and what it found."""
        share = {} if self.target.share is None else {"share": self.target.share}
        points = [point.to_json() for point in self.points]
        return {"slo": dict(self.slo), "points": points, "unit": self.unit.name, **share, "said": self.found()}


@dataclass(frozen=True)
class Extent:
    """What a probe may cost before it runs, over every course it can take: its most points, and the least and the
    most of a cost summed over the points of one course."""

    most_points: int
    least_cost: float
    most_cost: float


def extent(probe: Probe, cost: Callable[[float], float]) -> Extent:
    """Every course the probe can take, each point met or refused (a capacity anywhere in its range)."""
    courses = [[point.size for point in course] for course in _courses(probe)]
    costs = [sum(cost(size) for size in course) for course in courses]
    return Extent(max(len(course) for course in courses), min(costs), max(costs))


def _courses(probe: Probe) -> list[list[Point]]:
    if probe.every:  # each size runs, whatever the verdicts
        return [[Point(size, "met") for size in probe.sizes]]
    size = probe.next_size()
    if size is None:
        return [probe.points]
    found = []
    for verdict in ("met", "slo"):
        branch = replace(probe, points=list(probe.points))
        branch.add(Point(size, verdict))
        found += _courses(branch)
    return found


def _size(size: float) -> str:
    return f"{size:g}"


@dataclass(frozen=True)
class CapacityUnit:
    """What a probe climbs, as the report and the commands say it: the axis, and the figure carried at each size."""

    name: str  # as a capacity stores it: batch, rate, concurrency
    axis: str
    carried: str  # the figure a curve draws against the size (a metric name, autotune/figures/metrics/)
    carried_axis: str
    said: str  # a size in words: "{:g}" filled with the size
    prompts_at_once: bool = False  # a size is the prompts generate() takes at once: a deployment batches that many
    by_share: bool = False  # a size meets the SLO when a share of its requests do (serve's --slo-share)

    def size_text(self, size: float) -> str:
        return self.said.format(size)


_TOKENS = (THROUGHPUT.name, "decode throughput (tokens/s)")
_GOODPUT = (GOODPUT.name, "goodput (requests/s within the SLO)")
UNITS = {
    unit.name: unit
    for unit in (
        CapacityUnit("batch", "batch size", *_TOKENS, "batch {:g}", prompts_at_once=True),
        CapacityUnit("rate", "requests/s offered", *_GOODPUT, "{:g} requests/s", by_share=True),
        CapacityUnit("concurrency", "concurrent clients", *_GOODPUT, "{:g} concurrent clients", by_share=True),
    )
}


def capacity_unit(name: str | None) -> CapacityUnit:
    """The unit a stored capacity names (a batch when it names none, as the first ones stored)."""
    name = name or "batch"
    return UNITS.get(name) or CapacityUnit(name, name, THROUGHPUT.name, "throughput (tokens/s)", name + " {:g}")
