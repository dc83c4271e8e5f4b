"""throughput: a batch of prompts at once through generate() or continuous batching, decode tokens per second."""

from __future__ import annotations

from autotune.figures.slo import describe_slo
from autotune.specs import WorkloadSpec
from autotune.workloads.base import MIN_SECONDS, SLO, WorkloadKind, register


@register
class Throughput(WorkloadKind):
    name = "throughput"
    help = "a batch of prompts at once (--batch-size); with a range, the largest batch within --slo and the memory"
    flags = (SLO, MIN_SECONDS)
    probes = "batch"

    def describe_probe(self, spec: WorkloadSpec) -> str | None:
        if not spec.batch_sizes:
            return None
        sizes = ", ".join(map(str, spec.batch_sizes))
        within = f"within {describe_slo(spec.slo)} and " if spec.slo else "within "
        # A larger batch's iterations take longer on a CPU and about as long on a GPU: each point is costed as a
        # one-batch trial's measuring (an upper estimate); the forecast learns the real cost from the first trials.
        return (
            f"each trial probes its capacity: batch sizes {sizes}, climbing {within}the memory; up to about "
            f"{len(spec.batch_sizes)}x a trial of one batch of the same configuration: a plain trial here is such a "
            "probe"
        )
