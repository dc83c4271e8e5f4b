"""Speed figures of a trial from its timed iterations: speed with its spread, the roofline share, the cost.

Plain arithmetic with no torch, shared by the trial worker and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.figures.metrics import (
    ACHIEVED_BANDWIDTH,
    E2E_THROUGHPUT,
    FIRST_CALL_S,
    ROOFLINE_FRACTION,
    THROUGHPUT,
    THROUGHPUT_CV,
    TPOT,
    TPOT_P95,
    TTFT,
    TTFT_P95,
)
from autotune.figures.stats import Summary, percentile


@dataclass(frozen=True)
class Iteration:
    """One timed run of the workload."""

    elapsed_s: float
    ttft_s: float  # mean over requests of the time to their first token
    decode_tok_s: float  # tokens after each request's first, per second of decoding
    e2e_tok_s: float  # all generated tokens per second of the whole call
    gaps_s: list[float]  # times between consecutive tokens of a request, all requests
    generated: list[list[int]]


def speed_figures(iterations: list[Iteration], first: Iteration) -> tuple[dict[str, float], dict[str, dict]]:
    """Flat figures (medians, p95, CV) and the full spread of each timed quantity."""
    summaries = {
        THROUGHPUT.name: Summary.of([i.decode_tok_s for i in iterations]),
        E2E_THROUGHPUT.name: Summary.of([i.e2e_tok_s for i in iterations]),
        TTFT.name: Summary.of([i.ttft_s for i in iterations]),
        TPOT.name: Summary.of([gap for i in iterations for gap in i.gaps_s] or [0.0]),
        "iteration_s": Summary.of([i.elapsed_s for i in iterations]),
    }
    metrics = {
        THROUGHPUT.name: summaries[THROUGHPUT.name].p50,
        "throughput_p95_tok_s": summaries[THROUGHPUT.name].p95,
        THROUGHPUT_CV.name: summaries[THROUGHPUT.name].cv,
        E2E_THROUGHPUT.name: summaries[E2E_THROUGHPUT.name].p50,
        TTFT.name: summaries[TTFT.name].p50,
        TTFT_P95: summaries[TTFT.name].p95,
        TPOT.name: summaries[TPOT.name].p50,
        TPOT_P95: summaries[TPOT.name].p95,
        "iterations": float(len(iterations)),
        "iteration_s": summaries["iteration_s"].p50,
        FIRST_CALL_S: first.elapsed_s,
        "compile_s": max(0.0, first.elapsed_s - summaries["iteration_s"].p50),
    }
    return metrics, {name: summary.to_json() for name, summary in summaries.items()}


LATENCY_PERCENTILES = (50, 90, 95, 99)


def latency_percentiles(iterations: list[Iteration]) -> dict[str, float]:
    """What an SLO judges a batch by: time to first token and end-to-end time of each call, and the time per output
    token (each gap between a request's tokens: `itl`), at p50, p90, p95 and p99."""
    samples = {
        "ttft": [i.ttft_s for i in iterations],
        "itl": [gap for i in iterations for gap in i.gaps_s] or [0.0],
        "e2e": [i.elapsed_s for i in iterations],
    }
    return {
        f"{figure}_p{q}_s": percentile(sorted(values), q)
        for figure, values in samples.items()
        for q in LATENCY_PERCENTILES
    }


# ----------------------------------------------------------------------------------------- roofline


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, element_bytes: float) -> float:
    """Keys and values of one token in every layer."""
    return 2 * layers * kv_heads * head_dim * element_bytes


def decode_bytes_per_step(
    weight_bytes: float, kv_per_token: float, requests: int, input_len: int, output_len: int
) -> float:
    """Bytes one decoding step reads: every weight once, and each request's cache at its mean length."""
    mean_context = input_len + output_len / 2
    return weight_bytes + kv_per_token * requests * mean_context


def roofline(decode_tok_s: float, requests: int, bytes_per_step: float, peak_gb_s: float) -> dict[str, float]:
    """Achieved memory bandwidth of decoding (bytes per generated token x tokens/s) and its share of peak."""
    achieved_gb_s = bytes_per_step / requests * decode_tok_s / 1e9
    return {ACHIEVED_BANDWIDTH.name: achieved_gb_s, ROOFLINE_FRACTION.name: achieved_gb_s / peak_gb_s}


def cost_per_million_tokens(price_per_hour: float, tokens_per_s: float) -> float:
    """What a million generated tokens cost at this throughput and hourly price."""
    return price_per_hour / 3600 / tokens_per_s * 1e6


# ------------------------------------------------------------------------------------ output checks
