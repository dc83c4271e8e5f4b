"""latency: one prompt at a time; time to first token and per-token latency."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import ClassVar

from autotune.specs import WorkloadSpec
from autotune.workloads.base import MIN_SECONDS, WorkloadKind, register


@register
class Latency(WorkloadKind):
    name = "latency"
    help = "one prompt at a time"
    flags = (MIN_SECONDS,)
    aims: ClassVar[Mapping[str, tuple[str, ...]]] = {"speed": ("latency",), "time": ("latency",), "memory": ("memory",)}
    requests_wait = False

    def requests(self, spec: WorkloadSpec) -> int:
        return 1

    def as_run(self, spec: WorkloadSpec) -> WorkloadSpec:
        return replace(spec, batch_size=1)
