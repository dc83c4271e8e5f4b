"""A capacity probe in the report, as data (no drawing here): what the configuration carried and its latency at each
size, the SLO, the size chosen and the first refused above it, from the trial's stored capacity
(autotune.figures.capacity.Capacity). report/capacity_chart.py draws it."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.analysis.capacity import AtCapacity
from autotune.figures.capacity import CapacityUnit, Point, SloTarget
from autotune.figures.metrics import ITL_P95, PEAK_MEMORY_BYTES, SLO_SHARE
from autotune.figures.slo import describe_slo
from autotune.study import TrialRecord


@dataclass(frozen=True)
class CurvePoint:
    """One point of a capacity probe as the curve draws it."""

    size: float
    verdict: str  # met, or why it was refused: slo, oom, memory (autotune.figures.capacity.Verdict)
    carried: float | None  # the unit's carried figure (tokens/s for a batch, goodput for a load); None: not measured
    latency: dict[str, float]  # the curve's latency figures this point measured, in seconds
    memory_bytes: float | None
    share: float | None  # under load: the share of its requests within the SLO
    reason: str  # why it was refused


@dataclass(frozen=True)
class SloLine:
    """A bound of the SLO, drawn across the latency axis."""

    figure: str  # itl_p95_s
    bound_s: float

    @property
    def label(self) -> str:
        return f"SLO {describe_slo({self.figure: self.bound_s})}"


@dataclass(frozen=True)
class CapacityCurve:
    """A configuration's capacity probe: what it carried and its latency at each size, the SLO, the size chosen,
    and the first size refused above it (why the probe stopped climbing)."""

    number: int  # the trial
    unit: CapacityUnit
    target: SloTarget
    latency_figures: list[str]  # drawn on the latency axis: the SLO's, and the per-token latency (itl_p95)
    points: list[CurvePoint]
    chosen: CurvePoint | None
    refused: CurvePoint | None
    said: str  # what the probe found, in one line, with the SLO

    @property
    def slo_lines(self) -> list[SloLine]:
        return [SloLine(figure, bound) for figure, bound in self.target.slo.items()]

    @property
    def unmeasured(self) -> list[CurvePoint]:
        """Refused without figures to draw: out of memory, or predicted not to fit."""
        return [point for point in self.points if point.carried is None]


PER_TOKEN = ITL_P95  # the per-token latency a curve draws when the SLO bounds none


def capacity_curve(record: TrialRecord, found: AtCapacity | None) -> CapacityCurve | None:
    """The curve of a trial's capacity probe; None for a trial that probed none."""
    probe = record.capacity
    if found is None or probe is None:
        return None
    slo = list(probe.slo)
    wanted = slo if any(name.startswith("itl_") for name in slo) else [*slo, PER_TOKEN]
    measured = {name for point in probe.points for name in point.figures}
    latency_figures = [name for name in wanted if name in measured]
    points = {point.size: _curve_point(point, found.unit, latency_figures) for point in probe.points}
    chosen, refused = probe.chosen, probe.refused
    return CapacityCurve(
        number=record.number,
        unit=found.unit,
        target=found.target,
        latency_figures=latency_figures,
        points=list(points.values()),
        chosen=points[chosen.size] if chosen else None,
        refused=points[refused.size] if refused else None,
        said=found.capacity_line(),
    )


def _curve_point(point: Point, unit: CapacityUnit, latency_figures: list[str]) -> CurvePoint:
    figures = point.figures
    return CurvePoint(
        size=point.size,
        verdict=point.verdict,
        carried=figures.get(unit.carried),
        latency={name: figures[name] for name in latency_figures if name in figures},
        memory_bytes=figures.get(PEAK_MEMORY_BYTES),
        share=figures.get(SLO_SHARE),
        reason=point.reason,
    )
