"""serve: the configuration as deployed, `transformers serve` under a load of concurrent requests (`--load`), judged
by latency percentiles and goodput under an SLO (`--slo`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

from autotune.errors import UserError
from autotune.extras import SERVE
from autotune.specs import ServeSpec, WorkloadSpec
from autotune.workloads.base import WorkloadKind, register

LOAD_FORM = (
    "rate=2,4,8 (Poisson arrivals, requests/s) or concurrency=1,8,32 (clients), each measured; or a range searched "
    "for the highest level within the SLO, rate=1-64"
)


@register
class Serve(WorkloadKind):
    name = "serve"
    help = "transformers serve under load (--load, --slo)"
    flags = ("--load", "--slo", "--slo-share", "--serve-port")
    probes = "load"
    metrics = frozenset({"goodput_req_s", "requests_per_s", "errors"})  # latency percentiles: every kind's
    # Continuous batching first: it keeps the GPU busy under concurrent requests; then what a single batch wants.
    aims: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "speed": ("serve", "throughput"),
        "time": ("serve", "throughput"),
        "memory": ("memory",),
    }
    needs_servable_plan = True
    times_generate = False  # requests through a server: no decode ceiling compares with them
    packages = SERVE
    runner = "autotune.worker.serve_trial:run"

    def describe(self, spec: WorkloadSpec) -> str:
        prompts = "1 prompt" if spec.batch_size == 1 else f"{spec.batch_size} prompts"
        return f"{prompts} sent to transformers serve, {spec.input_len} tokens in, {spec.output_len} out"

    def as_run(self, spec: WorkloadSpec) -> WorkloadSpec:
        return spec if spec.serve is not None else replace(spec, serve=ServeSpec())

    def options(self, given: Mapping[str, Any]) -> dict[str, Any]:
        spec = ServeSpec(port=given.get("--serve-port"))
        if load := given.get("--load"):
            spec.mode, levels = parse_load(load)  # type: ignore[assignment]
            if "-" in load:
                spec.levels, spec.bracket = [], levels
            else:
                spec.levels = levels
        return {"serve": spec}


def parse_load(text: str) -> tuple[str, list[float]]:
    """`rate=2,4,8` -> ("rate", [2, 4, 8]); `concurrency=1,8` -> ("concurrency", [1, 8]); a range `rate=1-64` -> its
    two ends, ("rate", [1, 64])."""
    mode, separator, values = text.strip().partition("=")
    mode = mode.strip().lower()
    if not separator or mode not in ("rate", "concurrency"):
        raise UserError(f"--load {text!r} is not a load: write {LOAD_FORM}")
    try:
        levels = [float(value) for value in values.split("-" if "-" in values else ",")]
    except ValueError:
        raise UserError(f"--load {text!r}: every level must be a number, as in {LOAD_FORM}") from None
    if "-" in values and (len(levels) != 2 or not levels[0] < levels[1]):
        raise UserError(f"--load {text!r}: a range is its lowest and highest level, lowest first, as in rate=1-64")
    if not levels or any(not level > 0 for level in levels):
        raise UserError(f"--load {text!r}: every level must be above 0, as in {LOAD_FORM}")
    if mode == "concurrency" and any(level != int(level) for level in levels):
        raise UserError(f"--load {text!r}: a concurrency is a whole number of clients")
    return mode, sorted(set(levels))
