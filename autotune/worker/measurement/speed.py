"""Speed figures of a trial from its timed iterations: speed with its spread, the roofline share, the cost.

Plain arithmetic with no torch, shared by the trial worker and the tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from statistics import median

from autotune.figures.metrics import (
    ACHIEVED_BANDWIDTH,
    E2E_THROUGHPUT,
    FIRST_CALL_S,
    GOODPUT_TOKENS,
    PREFIX_HIT_RATE,
    REQUESTS_SERVED,
    ROOFLINE_FRACTION,
    THROUGHPUT,
    THROUGHPUT_CV,
    TOKENS_GENERATED,
    TPOT,
    TPOT_P95,
    TTFT,
    TTFT_P95,
    WASTED_SHARE,
)
from autotune.figures.slo import request_figures, within_slo
from autotune.figures.stats import Summary, percentile


@dataclass(frozen=True)
class Served:
    """A replay of a trace's requests (--traffic), request by request: each one's time to its first token and to its
    last, counted from when it could start (the replay's start where every request waits its turn), its own gaps
    between tokens, the tokens it asked for (and received); and the decode steps the replay ran, row by row (a row
    whose request had ended included)."""

    ttfts_s: list[float]
    e2es_s: list[float]
    gaps_s: list[list[float]]
    lengths: list[int]
    row_steps: int
    input_tokens: int = 0
    reused: int | None = None  # input tokens read from a reused prefix; None: not counted (none is shared)

    @property
    def requests(self) -> int:
        return len(self.ttfts_s)

    @property
    def wanted(self) -> int:
        return sum(self.lengths)

    @property
    def wasted_share(self) -> float:
        return 1 - self.wanted / self.row_steps if self.row_steps else 0.0

    def tokens_within(self, slo: Mapping[str, float]) -> int:
        """The tokens of the requests that met the SLO, each judged by its own figures (all of them without one)."""
        met = [
            length
            for ttft, e2e, gaps, length in zip(self.ttfts_s, self.e2es_s, self.gaps_s, self.lengths, strict=True)
            if within_slo(request_figures(ttft, e2e, gaps, slo), slo)
        ]
        return sum(met)


@dataclass(frozen=True)
class Iteration:
    """One timed run of the workload."""

    elapsed_s: float
    ttft_s: float  # mean over requests of the time to their first token
    decode_tok_s: float  # tokens after each request's first, per second of decoding
    e2e_tok_s: float  # all generated tokens per second of the whole call
    gaps_s: list[float]  # times between consecutive tokens of a request, all requests
    generated: list[list[int]]
    served: Served | None = None  # a trace's replay: its requests one by one


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
    token (each gap between a request's tokens: `itl`), at p50, p90, p95 and p99. A trace's replay: each request's own
    time to first token and end-to-end time."""
    served = [i.served for i in iterations if i.served is not None]
    samples = {
        "ttft": [t for s in served for t in s.ttfts_s] if served else [i.ttft_s for i in iterations],
        "itl": [gap for i in iterations for gap in i.gaps_s] or [0.0],
        "e2e": [t for s in served for t in s.e2es_s] if served else [i.elapsed_s for i in iterations],
    }
    return {
        f"{figure}_p{q}_s": percentile(sorted(values), q)
        for figure, values in samples.items()
        for q in LATENCY_PERCENTILES
    }


def traffic_figures(iterations: list[Iteration], slo: Mapping[str, float]) -> dict[str, float]:
    """A trace's replays: goodput (the tokens of the requests within the SLO, per second of the replay), the share of
    decode steps spent on rows whose request had ended, the requests and tokens each replay served (medians over the
    replays), and where its requests share prefixes, the share of input tokens read from one reused (the last
    replay's: the first fills the cache). Nothing for a workload of one shape."""
    replays = [(i, i.served) for i in iterations if i.served is not None]
    if not replays:
        return {}
    last = replays[-1][1]
    hits = {PREFIX_HIT_RATE.name: last.reused / last.input_tokens} if last.reused is not None else {}
    return hits | {
        GOODPUT_TOKENS.name: median([served.tokens_within(slo) / i.elapsed_s for i, served in replays]),
        WASTED_SHARE.name: median([served.wasted_share for _, served in replays]),
        REQUESTS_SERVED.name: float(replays[-1][1].requests),
        TOKENS_GENERATED.name: float(sum(len(row) for row in replays[-1][0].generated)),  # each its own length
    }


# ----------------------------------------------------------------------------------------- roofline


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, element_bytes: float) -> float:
    """Keys and values of one token in every layer."""
    return 2 * layers * kv_heads * head_dim * element_bytes


def decode_bytes_per_step(
    weight_bytes: float, kv_per_token: float, requests: int, input_len: float, output_len: float
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
