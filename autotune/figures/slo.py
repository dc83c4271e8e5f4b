"""A latency objective (`--slo`) as users write it: bounds on latency percentiles; bad input is one UserError line."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from autotune.errors import UserError
from autotune.figures.stats import percentile

SLO_FORM = '"ttft_p95<=300ms,itl_p95<=50ms" (ttft, itl or e2e; p50, p90, p95 or p99; us, ms or s)'
SLO_FIGURES = ("ttft", "itl", "e2e")
PERCENTILES = (50, 90, 95, 99)
_SLO_PATTERN = re.compile(
    r"^(?P<figure>[a-z][a-z0-9]*)_p(?P<percentile>\d+)\s*<=\s*(?P<number>\d+\.?\d*|\.\d+)\s*(?P<unit>us|ms|s)$"
)
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_slo(text: str) -> dict[str, float]:
    """`ttft_p95<=300ms,itl_p95<=50ms` -> {"ttft_p95_s": 0.3, "itl_p95_s": 0.05}."""
    bounds: dict[str, float] = {}
    for part in filter(None, (piece.strip().lower() for piece in text.split(","))):
        match = _SLO_PATTERN.match(part)
        if match is None:
            raise UserError(f"--slo {text!r}: cannot read {part!r}; write it as {SLO_FORM}")
        figure, percentile = match["figure"], int(match["percentile"])
        if figure not in SLO_FIGURES or percentile not in PERCENTILES:
            raise UserError(f"--slo {text!r}: {part!r} names no figure; write it as {SLO_FORM}")
        bounds[f"{figure}_p{percentile}_s"] = float(match["number"]) * _SECONDS[match["unit"]]
    if not bounds and text.strip():
        raise UserError(f"--slo {text!r} names no objective; write it as {SLO_FORM}")
    return bounds


def describe_slo(slo: dict[str, float]) -> str:
    """{"ttft_p95_s": 0.3, "e2e_p99_s": 2.0} -> "ttft_p95<=300ms,e2e_p99<=2s", as --slo reads it."""
    return ",".join(f"{name.removesuffix('_s')}<={_seconds(bound)}" for name, bound in slo.items())


def _seconds(bound: float) -> str:
    if bound >= 1:
        return f"{bound:g}s"
    return f"{bound * 1000:g}ms" if bound >= 1e-3 else f"{bound * 1e6:g}us"


def in_ms(seconds: float) -> str:
    """0.0062 -> "6.2 ms"."""
    return f"{seconds * 1000:.3g} ms"


def slo_misses(figures: Mapping[str, float], slo: Mapping[str, float]) -> list[str]:
    """The one judge of an SLO: the bounds the figures exceed, as users write them ("itl_p95 6.2 ms > 5 ms"); a bound
    whose figure was not measured is missed ("itl_p95 not measured"). None missed: within the SLO."""
    misses = []
    for name, bound in slo.items():
        value, label = figures.get(name), name.removesuffix("_s")
        if value is None:
            misses.append(f"{label} not measured")
        elif value > bound:
            misses.append(f"{label} {in_ms(value)} > {in_ms(bound)}")
    return misses


def within_slo(figures: Mapping[str, float], slo: Mapping[str, float]) -> bool:
    return not slo_misses(figures, slo)


def request_figures(ttft_s: float, e2e_s: float, gaps_s: Sequence[float], slo: Mapping[str, float]) -> dict[str, float]:
    """One request's own figure for each bound of the SLO: `ttft_p95_s` its TTFT, `e2e_p95_s` its latency, `itl_p95_s`
    the p95 of its own gaps between tokens (0 without any)."""
    figures = {}
    ordered = sorted(gaps_s)
    for name in slo:
        figure, q = name.split("_")[0], float(name.split("_")[1][1:])
        if figure == "ttft":
            figures[name] = ttft_s
        elif figure == "e2e":
            figures[name] = e2e_s
        else:
            figures[name] = percentile(ordered, q) if ordered else 0.0
    return figures
