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

E2E_THROUGHPUT = Metric("e2e_throughput_tok_s", "end-to-end throughput", "tok/s", "maximize")
TTFT = Metric("ttft_s", "time to first token (p50)", "s", "minimize")
TPOT = Metric("tpot_s", "per-token latency (p50)", "s", "minimize")
PERPLEXITY = Metric("perplexity", "perplexity", "", "minimize")
PERPLEXITY_DELTA = Metric("perplexity_delta", "perplexity change vs reference", "", "minimize")
THROUGHPUT_CV = Metric("throughput_cv", "throughput coefficient of variation", "", "minimize")
ACHIEVED_BANDWIDTH = Metric("achieved_bandwidth_gb_s", "achieved memory bandwidth in decode", "GB/s", "maximize")
ROOFLINE_FRACTION = Metric("roofline_fraction", "share of the profile's peak memory bandwidth", "", "maximize")
COST_PER_MILLION_TOKENS = Metric("cost_per_million_tokens_usd", "cost per million generated tokens", "USD", "minimize")
WARMUP = Metric("warmup_s", "warm-up (compile included)", "s", "minimize")
# the serve workload (transformers serve under load)
GOODPUT = Metric("goodput_req_s", "goodput: requests/s within the SLOs", "req/s", "maximize")
REQUESTS_PER_S = Metric("requests_per_s", "completed requests per second", "req/s", "maximize")
ERRORS = Metric("errors", "failed requests", "", "minimize")
ENERGY_PER_TOKEN = Metric("energy_j_per_token", "GPU energy per generated token", "J", "minimize")
# capacity: the largest batch or load within the SLO (autotune/workloads/capacity.py)
CAPACITY = Metric("capacity", "capacity: the largest batch or load within the SLO", "", "maximize")
MEETS_SLO_FIGURE = Metric("meets_slo", "meets the SLO at some batch or load (1 yes, 0 no)", "")

LATENCY_FIGURES = {"ttft": "time to first token", "itl": "inter-token latency", "e2e": "request latency"}
LATENCY_QUANTILES = (50, 90, 95, 99)


def percentile_name(figure: str, q: int) -> str:
    """The name of a latency percentile: ("itl", 95) -> "itl_p95_s"."""
    return f"{figure}_p{q}_s"


TTFT_P50, TTFT_P95 = percentile_name("ttft", 50), percentile_name("ttft", 95)
ITL_P50, ITL_P95 = percentile_name("itl", 50), percentile_name("itl", 95)
E2E_P95 = percentile_name("e2e", 95)
TPOT_P95 = "tpot_p95_s"  # the per-token latency's p95 (TPOT is its p50)

REPORTED: tuple[Metric, ...] = (
    THROUGHPUT,
    E2E_THROUGHPUT,
    TTFT,
    TPOT,
    PEAK_MEMORY,
    KL_DIVERGENCE,
    TOP1_AGREEMENT,
    TOKEN_AGREEMENT,
    GREEDY_AGREEMENT,
    PERPLEXITY,
    PERPLEXITY_DELTA,
    THROUGHPUT_CV,
    ACHIEVED_BANDWIDTH,
    ROOFLINE_FRACTION,
    COST_PER_MILLION_TOKENS,
    WARMUP,
    # the serve workload (transformers serve under load); latency percentiles of every workload
    GOODPUT,
    REQUESTS_PER_S,
    ERRORS,
    *(
        Metric(percentile_name(figure, q), f"{label} (p{q})", "s", "minimize")
        for figure, label in LATENCY_FIGURES.items()
        for q in LATENCY_QUANTILES
    ),
    ENERGY_PER_TOKEN,
    CAPACITY,
    MEETS_SLO_FIGURE,
)

# Figures a trial or a point of a capacity probe reports that are no metric of a study (no label, never an objective).
PEAK_MEMORY_BYTES = "peak_memory_bytes"  # peak memory in bytes: PEAK_MEMORY is the same in GB
OUTPUT_TOK_S = "output_tok_s"  # a load level: the server's generated tokens/s
SLO_SHARE = "slo_share"  # a load level: the share of its requests within the SLO
REQUESTS = "requests"  # a load level: the requests it sent
IN_FLIGHT_PEAK = "in_flight_peak"  # a load level: the most requests in flight at once
FIRST_CALL_S = "first_call_s"  # the workload's first call (compiles where its shapes are new)
TP_RANKS = "tp_ranks"  # tensor parallelism: the ranks one trial ran on

METRICS: dict[str, Metric] = {metric.name: metric for metric in REPORTED}


def objectives_named(names: Sequence[str]) -> tuple[Metric, ...]:
    """The metrics a study optimises, from their names as its settings store them."""
    unknown = [name for name in names if name not in METRICS or METRICS[name].direction is None]
    if unknown:
        raise ValueError(f"not an objective: {', '.join(unknown)}; known: {', '.join(OBJECTIVE_CHOICES)}")
    return tuple(METRICS[name] for name in names)


OBJECTIVE_CHOICES = tuple(name for name, metric in METRICS.items() if metric.direction is not None)
