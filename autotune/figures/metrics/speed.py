"""Speed and latency: decode throughput, the time to the first token and per token, their spread, what share of the
memory bandwidth they reach, what a token costs in money and energy, the warm-up, and the latency percentiles every
workload reports."""

from __future__ import annotations

from autotune.figures.metrics.metric import COLUMN, FRONT, KEPT, REPORT, Family, Metric

THROUGHPUT = Metric(
    "throughput_tok_s",
    "decode throughput",
    "tok/s",
    "maximize",
    short="throughput",
    axis="tokens/s",
    shown=FRONT,
    column="tok/s",
    cell="{:.1f}",
    line="{} tok/s",
    compared=COLUMN,
    aliases=(("throughput", "tok/s"), ("tok_s", "tok/s"), ("tokens_per_s", "tok/s")),
    forecast="speed",
)
E2E_THROUGHPUT = Metric(
    "e2e_throughput_tok_s",
    "end-to-end throughput",
    "tok/s",
    "maximize",
    aliases=(("e2e_throughput", "tok/s"),),
    forecast="speed",
)
TTFT = Metric(
    "ttft_s",
    "time to first token (p50)",
    "s",
    "minimize",
    shown=FRONT,
    column="ttft",
    cell="{:.1f} ms",
    scale=1000.0,
    line="ttft {}",
    compared=COLUMN,
    aliases=(("ttft", "s"), ("ttft_ms", "ms")),
    forecast="time",
)
TPOT = Metric(
    "tpot_s",
    "per-token latency (p50)",
    "s",
    "minimize",
    shown=REPORT,
    column="ms/token",
    cell="{:.2f}",
    scale=1000.0,
    compared=KEPT,
    aliases=(("tpot", "s"), ("tpot_ms", "ms"), ("latency_ms", "ms")),
    forecast="time",
)
THROUGHPUT_CV = Metric("throughput_cv", "throughput coefficient of variation", "", "minimize")
ACHIEVED_BANDWIDTH = Metric(
    "achieved_bandwidth_gb_s", "achieved memory bandwidth in decode", "GB/s", "maximize",
    aliases=(("bandwidth", "gb/s"),), forecast="speed",
)  # fmt: skip
ROOFLINE_FRACTION = Metric(
    "roofline_fraction", "share of the profile's peak memory bandwidth", "", "maximize", aliases=(("roofline", ""),)
)
COST_PER_MILLION_TOKENS = Metric(
    "cost_per_million_tokens_usd", "cost per million generated tokens", "USD", "minimize",
    aliases=(("cost", "usd"),), forecast="time",
)  # fmt: skip
WARMUP = Metric("warmup_s", "warm-up (compile included)", "s", "minimize", aliases=(("warmup", "s"),))
ENERGY_PER_TOKEN = Metric(
    "energy_j_per_token", "GPU energy per generated token", "J", "minimize", aliases=(("energy", "j"),),
    forecast="time",
)  # fmt: skip

LATENCY_FIGURES = {"ttft": "time to first token", "itl": "inter-token latency", "e2e": "request latency"}
LATENCY_QUANTILES = (50, 90, 95, 99)
FORECAST_QUANTILES = (50, 95, 99)


def percentile_name(figure: str, q: int) -> str:
    """The name of a latency percentile: ("itl", 95) -> "itl_p95_s"."""
    return f"{figure}_p{q}_s"


def _percentile_family(q: int) -> Family | None:
    """The forecast moves the p50, p95 and p99 of latency with a knob's expected speed (the p90 never was)."""
    return "time" if q in FORECAST_QUANTILES else None


LATENCY_PERCENTILES: tuple[Metric, ...] = tuple(
    Metric(percentile_name(figure, q), f"{label} (p{q})", "s", "minimize", forecast=_percentile_family(q))
    for figure, label in LATENCY_FIGURES.items()
    for q in LATENCY_QUANTILES
)

TTFT_P50, TTFT_P95 = percentile_name("ttft", 50), percentile_name("ttft", 95)
ITL_P50, ITL_P95 = percentile_name("itl", 50), percentile_name("itl", 95)
E2E_P95 = percentile_name("e2e", 95)
TPOT_P95 = "tpot_p95_s"  # the per-token latency's p95 (TPOT is its p50)

# Figures a trial reports that are no metric of a study (no label, never an objective).
FIRST_CALL_S = "first_call_s"  # the workload's first call (compiles where its shapes are new)
TP_RANKS = "tp_ranks"  # tensor parallelism: the ranks one trial ran on
