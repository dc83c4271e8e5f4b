"""`--load` and `--slo` as users write them, read into a ServeSpec; bad input is one UserError line."""

from __future__ import annotations

import re

from autotune.errors import UserError
from autotune.extras import SERVE, why_missing
from autotune.specs import ServeSpec

LOAD_FORM = "rate=2,4,8 (Poisson arrivals, requests/s) or concurrency=1,8,32 (clients)"
SLO_FORM = '"ttft_p95<=300ms,itl_p95<=50ms" (ttft, itl or e2e; p50, p90, p95 or p99; us, ms or s)'
SLO_FIGURES = ("ttft", "itl", "e2e")
PERCENTILES = (50, 90, 95, 99)
_SLO_PATTERN = re.compile(
    r"^(?P<figure>[a-z][a-z0-9]*)_p(?P<percentile>\d+)\s*<=\s*(?P<number>\d+\.?\d*|\.\d+)\s*(?P<unit>us|ms|s)$"
)
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_load(text: str) -> tuple[str, list[float]]:
    """`rate=2,4,8` -> ("rate", [2, 4, 8]); `concurrency=1,8` -> ("concurrency", [1, 8])."""
    mode, separator, values = text.strip().partition("=")
    mode = mode.strip().lower()
    if not separator or mode not in ("rate", "concurrency"):
        raise UserError(f"--load {text!r} is not a load: write {LOAD_FORM}")
    try:
        levels = [float(value) for value in values.split(",")]
    except ValueError:
        raise UserError(f"--load {text!r}: every level must be a number, as in {LOAD_FORM}") from None
    if not levels or any(not level > 0 for level in levels):
        raise UserError(f"--load {text!r}: every level must be above 0, as in {LOAD_FORM}")
    if mode == "concurrency" and any(level != int(level) for level in levels):
        raise UserError(f"--load {text!r}: a concurrency is a whole number of clients")
    return mode, sorted(set(levels))


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


def serve_spec(load: str | None, slo: str | None, port: int | None) -> ServeSpec:
    """The serve workload's load from the command line (defaults where a flag is not given)."""
    spec = ServeSpec(slo=parse_slo(slo or ""), port=port)
    if load:
        spec.mode, spec.levels = parse_load(load)  # type: ignore[assignment]
    return spec


def describe_slo(slo: dict[str, float]) -> str:
    """{"ttft_p95_s": 0.3} -> "ttft_p95<=300ms"."""
    return ",".join(f"{name.removesuffix('_s')}<={bound * 1000:g}ms" for name, bound in slo.items())


def workload_serve_spec(kind: str, load: str | None, slo: str | None, port: int | None) -> ServeSpec | None:
    """The serve load of `--workload serve`; the serve flags with another workload are bad input."""
    if kind != "serve":
        given = [flag for flag, value in (("--load", load), ("--slo", slo), ("--serve-port", port)) if value]
        if given:
            raise UserError(f"{', '.join(given)} apply only to --workload serve")
        return None
    missing = why_missing("--workload serve", SERVE)
    if missing:
        raise UserError(missing)
    spec = serve_spec(load, slo, port)
    from autotune.serving.server import bind_problem  # imports httpx: only once the serve extra is known there

    if port is not None and (problem := bind_problem(port)):
        raise UserError(f"--serve-port {port} cannot be bound on 127.0.0.1 ({problem}); give a free port or none")
    return spec
