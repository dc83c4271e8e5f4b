"""The figures a trial reports, and the three the study optimises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Direction = Literal["maximize", "minimize"]


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str
    direction: Direction | None = None


THROUGHPUT = Metric("throughput_tok_s", "decode throughput", "tok/s", "maximize")
PEAK_MEMORY = Metric("peak_memory_gb", "peak memory", "GB", "minimize")
KL_DIVERGENCE = Metric("kl_divergence", "KL divergence vs reference", "nats/token", "minimize")

# The study's objectives, in the order Optuna stores their values.
OBJECTIVES: tuple[Metric, ...] = (THROUGHPUT, PEAK_MEMORY, KL_DIVERGENCE)

REPORTED: tuple[Metric, ...] = (
    THROUGHPUT,
    Metric("e2e_throughput_tok_s", "end-to-end throughput", "tok/s", "maximize"),
    Metric("ttft_s", "time to first token (p50)", "s", "minimize"),
    Metric("tpot_s", "per-token latency (p50)", "s", "minimize"),
    PEAK_MEMORY,
    KL_DIVERGENCE,
    Metric("top1_agreement", "top-1 agreement with reference", "", "maximize"),
    Metric("perplexity", "perplexity", "", "minimize"),
    Metric("perplexity_delta", "perplexity change vs reference", "", "minimize"),
    Metric("throughput_cv", "throughput coefficient of variation", "", "minimize"),
    Metric("achieved_bandwidth_gb_s", "achieved memory bandwidth in decode", "GB/s", "maximize"),
    Metric("roofline_fraction", "share of the profile's peak memory bandwidth", "", "maximize"),
    Metric("cost_per_million_tokens_usd", "cost per million generated tokens", "USD", "minimize"),
    Metric("warmup_s", "warm-up (compile included)", "s", "minimize"),
    # the serve workload (transformers serve under load)
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
        for q in (50, 95, 99)
    ),
    Metric("energy_j_per_token", "GPU energy per generated token", "J", "minimize"),
)

METRICS: dict[str, Metric] = {metric.name: metric for metric in REPORTED}
