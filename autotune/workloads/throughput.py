"""throughput: a batch of prompts at once through generate() or continuous batching, decode tokens per second."""

from __future__ import annotations

from autotune.workloads.base import WorkloadKind, register


@register
class Throughput(WorkloadKind):
    name = "throughput"
    help = "a batch of prompts at once (--batch-size); with a range, the largest batch within --slo and the memory"
    flags = ("--slo",)
    probes = "batch"
