"""throughput: a batch of prompts at once through generate() or continuous batching, decode tokens per second."""

from __future__ import annotations

from autotune.figures.slo import describe_slo
from autotune.specs import WorkloadSpec
from autotune.workloads.base import WorkloadKind, register


@register
class Throughput(WorkloadKind):
    name = "throughput"
    help = "a batch of prompts at once (--batch-size); with a range, the largest batch within --slo and the memory"
    flags = ("--slo",)
    probes = "batch"

    def probe_cost(self, spec: WorkloadSpec) -> float:
        # A larger batch's iterations take longer on a CPU and about as long on a GPU: each point is costed as the
        # one-batch trial's measuring, the load and the quality check once (an upper estimate).
        return float(len(spec.batch_sizes) or 1)

    def probe_line(self, spec: WorkloadSpec) -> str | None:
        if not spec.probes_capacity:
            return None
        sizes = ", ".join(map(str, spec.batch_sizes))
        within = f"within {describe_slo(spec.slo)} and " if spec.slo else "within "
        return (
            f"each trial probes its capacity: batch sizes {sizes}, climbing {within}the memory; up to about "
            f"{self.probe_cost(spec):g}x a trial of one batch of the same configuration"
        )
