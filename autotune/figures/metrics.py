"""The figures a trial reports, and the objectives a study optimises (by default three of them).

A metric is data: its name in a trial's figures, label, unit, direction, and how it becomes a loss
on the common scale the Pareto front and the hypervolume use (lower is better; figures that span
decades, such as KL, compared on a log scale). Any metric with a direction can be an objective.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Direction = Literal["maximize", "minimize"]


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str
    direction: Direction | None = None
    log_floor: float | None = None  # compared as log10(max(value, floor)): it spans decades
    short: str = ""  # its name in table headers and legends
    axis: str = ""  # its axis title in the report's charts, on the scale it is compared on

    @property
    def heading(self) -> str:
        return self.short or self.label

    @property
    def axis_title(self) -> str:
        unit = f" ({self.unit})" if self.unit else ""
        return self.axis or f"{'log10 ' if self.log_floor else ''}{self.heading}{unit}"

    def on_scale(self, value: float) -> float:
        """The value on the scale it is compared on (log10 above its floor, or as it is)."""
        return math.log10(max(value, self.log_floor)) if self.log_floor else value

    def minimised(self, value: float) -> float:
        """As Optuna compares it: negated when higher is better (dominance, ties)."""
        if self.direction is None:
            raise ValueError(f"{self.name} has no direction, so it cannot be an objective")
        return -value if self.direction == "maximize" else value

    def loss(self, value: float) -> float:
        """As the hypervolume compares it: minimised, on its own scale."""
        return self.minimised(self.on_scale(value))


THROUGHPUT = Metric("throughput_tok_s", "decode throughput", "tok/s", "maximize", short="throughput", axis="tokens/s")
PEAK_MEMORY = Metric("peak_memory_gb", "peak memory", "GB", "minimize", short="peak memory", axis="peak memory (GB)")
KL_FLOOR = 1e-6  # the reference's KL is 0; below this, KL is noise around zero
KL_DIVERGENCE = Metric(
    "kl_divergence", "KL divergence vs reference", "nats/token", "minimize", KL_FLOOR, short="KL", axis="log10 KL"
)

TOP1_AGREEMENT = Metric("top1_agreement", "top-1 agreement with reference", "", "maximize", short="top-1")
# The reference's greedy continuations of the workload's prompts: the share of each that the trial's own outputs
# reproduced before diverging (greedy), and the share of positions where the trial, forced along them, puts the
# reference's token first (token: one early flip costs one position).
GREEDY_AGREEMENT = Metric("greedy_agreement", "greedy agreement with reference", "", "maximize", short="greedy")
TOKEN_AGREEMENT = Metric("token_agreement", "token agreement with reference", "", "maximize", short="tokens")

# The default objectives, in the order Optuna stores their values: every study before issue 17 has these.
OBJECTIVES: tuple[Metric, ...] = (THROUGHPUT, PEAK_MEMORY, KL_DIVERGENCE)

REPORTED: tuple[Metric, ...] = (
    THROUGHPUT,
    Metric("e2e_throughput_tok_s", "end-to-end throughput", "tok/s", "maximize"),
    Metric("ttft_s", "time to first token (p50)", "s", "minimize"),
    Metric("tpot_s", "per-token latency (p50)", "s", "minimize"),
    PEAK_MEMORY,
    KL_DIVERGENCE,
    TOP1_AGREEMENT,
    TOKEN_AGREEMENT,
    GREEDY_AGREEMENT,
    Metric("perplexity", "perplexity", "", "minimize"),
    Metric("perplexity_delta", "perplexity change vs reference", "", "minimize"),
    Metric("throughput_cv", "throughput coefficient of variation", "", "minimize"),
    Metric("achieved_bandwidth_gb_s", "achieved memory bandwidth in decode", "GB/s", "maximize"),
    Metric("roofline_fraction", "share of the profile's peak memory bandwidth", "", "maximize"),
    Metric("cost_per_million_tokens_usd", "cost per million generated tokens", "USD", "minimize"),
    Metric("warmup_s", "warm-up (compile included)", "s", "minimize"),
    # the serve workload (transformers serve under load); latency percentiles of every workload
    Metric("goodput_req_s", "goodput: requests/s within the SLOs", "req/s", "maximize"),
    Metric("requests_per_s", "completed requests per second", "req/s", "maximize"),
    Metric("errors", "failed requests", "", "minimize"),
    *(
        Metric(f"{figure}_p{q}_s", f"{label} (p{q})", "s", "minimize")
        for figure, label in (
            ("ttft", "time to first token"),
            ("itl", "inter-token latency"),
            ("e2e", "request latency"),
        )
        for q in (50, 90, 95, 99)
    ),
    Metric("energy_j_per_token", "GPU energy per generated token", "J", "minimize"),
    # capacity: the largest batch or load within the SLO (autotune/workloads/capacity.py)
    Metric("capacity", "capacity: the largest batch or load within the SLO", "", "maximize"),
    Metric("meets_slo", "meets the SLO at some batch or load (1 yes, 0 no)", ""),
)

METRICS: dict[str, Metric] = {metric.name: metric for metric in REPORTED}


def objectives_named(names: Sequence[str]) -> tuple[Metric, ...]:
    """The metrics a study optimises, from their names as its settings store them."""
    unknown = [name for name in names if name not in METRICS or METRICS[name].direction is None]
    if unknown:
        raise ValueError(f"not an objective: {', '.join(unknown)}; known: {', '.join(OBJECTIVE_CHOICES)}")
    return tuple(METRICS[name] for name in names)


OBJECTIVE_CHOICES = tuple(name for name, metric in METRICS.items() if metric.direction is not None)
