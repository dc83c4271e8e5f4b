"""Figures of a serve trial from its requests: latency percentiles, rates, errors and goodput.

Warm-up requests never count; failed requests are counted apart and never enter a latency figure.
A request meets the SLOs when its own time to first token and end-to-end latency are within their
bounds and the named percentile of its own inter-token gaps is within the ITL bound. Goodput is the
rate of requests that met them; without SLOs every completed request counts.

The trial's figures are those of one level, its capacity (the highest level sustained within the SLO), where it has
one; else its latency percentiles pool every level and its rates are the best level's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune.figures.metrics import (
    E2E_THROUGHPUT,
    ERRORS,
    GOODPUT,
    GOODPUT_TOKENS,
    IN_FLIGHT_PEAK,
    ITL_P50,
    ITL_P95,
    OUTPUT_TOK_S,
    REQUESTS,
    REQUESTS_PER_S,
    SLO_SHARE,
    THROUGHPUT,
    TPOT,
    TPOT_P95,
    TTFT,
    TTFT_P50,
    TTFT_P95,
)
from autotune.figures.slo import PERCENTILES, within_slo
from autotune.figures.slo import request_figures as slo_request_figures
from autotune.figures.stats import Summary, percentile
from autotune.serving.load import RequestRecord


def _percentiles(name: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {f"{name}_p{q}_s": percentile(ordered, q) for q in PERCENTILES}


def latency_percentiles(records: Sequence[RequestRecord]) -> dict[str, float]:
    """TTFT, inter-token latency (every gap of every request) and end-to-end latency, p50/p90/p95/p99."""
    done = [record for record in records if record.ok]
    return {
        **_percentiles("ttft", [record.ttft_s for record in done]),
        **_percentiles("itl", [gap for record in done for gap in record.gaps_s]),
        **_percentiles("e2e", [record.e2e_s for record in done]),
    }


def request_figures(record: RequestRecord, slo: dict[str, float]) -> dict[str, float]:
    """One completed request's own figure for each bound of the SLO (figures/slo.py)."""
    return slo_request_figures(record.ttft_s, record.e2e_s, record.gaps_s, slo)


def meets_slo(record: RequestRecord, slo: dict[str, float]) -> bool:
    """Whether one request completed within every bound of the SLO, judged by its own figures."""
    return record.ok and within_slo(request_figures(record, slo), slo)


def level_figures(level: float, records: Sequence[RequestRecord], slo: dict[str, float]) -> dict[str, Any]:
    """One load level: what was offered, what came back, and whether its percentiles met the SLOs."""
    done = [record for record in records if record.ok]
    ends = [record.end for record in records if record.end is not None] or [records[-1].start]
    duration = max(ends) - min(record.start for record in records)
    percentiles = latency_percentiles(records)
    met = [record for record in done if meets_slo(record, slo)]
    return {
        "load": level,
        REQUESTS: len(records),
        ERRORS.name: len(records) - len(done),
        "duration_s": duration,
        REQUESTS_PER_S.name: len(done) / duration if duration > 0 else 0.0,
        OUTPUT_TOK_S: sum(record.tokens for record in done) / duration if duration > 0 else 0.0,
        GOODPUT.name: len(met) / duration if duration > 0 else 0.0,
        GOODPUT_TOKENS.name: sum(record.tokens for record in met) / duration if duration > 0 else 0.0,
        SLO_SHARE: len(met) / len(records) if records else 0.0,  # of the requests sent, those that met the SLO
        "slo_met": bool(done) and within_slo(percentiles, slo),
        IN_FLIGHT_PEAK: float(in_flight_peak(records)),
        **percentiles,
    }


def in_flight_peak(records: Sequence[RequestRecord]) -> int:
    """The most requests the server held at once: sent, not yet answered in full (failed ones until they failed)."""
    events = sorted(
        [(record.start, 1) for record in records] + [(record.end, -1) for record in records if record.end is not None]
    )
    held = most = 0
    for _, change in events:  # at equal times an end (-1) sorts first: a request answered frees its place
        held += change
        most = max(most, held)
    return most


def serve_figures(
    records: Sequence[RequestRecord], slo: dict[str, float], at: float | None = None
) -> tuple[dict[str, float], dict[str, dict], list[dict[str, Any]]]:
    """Flat metrics of the trial, the spread of each latency, and the figures of each load level.

    `at`: the level whose figures are the trial's (its capacity); None: latency percentiles pool the measured requests
    of every level, and rates are the best level's. `requests` and `errors` count every level.
    """
    measured = [record for record in records if record.level is not None]
    levels = sorted({record.level for record in measured if record.level is not None})
    per_level = [level_figures(level, [r for r in measured if r.level == level], slo) for level in levels]
    done = [record for record in measured if record.ok]
    if not done:
        first_error = next((record.error for record in measured if record.error), "no request was sent")
        raise RuntimeError(f"every request to transformers serve failed; the first: {first_error}")
    counted = [level for level in per_level if at is None or level["load"] == at]
    pooled = [record for record in measured if at is None or record.level == at]
    best_tok_s = max(level[OUTPUT_TOK_S] for level in counted)
    metrics = {
        **latency_percentiles(pooled),
        REQUESTS: float(len(measured)),
        ERRORS.name: float(len(measured) - len(done)),
        REQUESTS_PER_S.name: max(level[REQUESTS_PER_S.name] for level in counted),
        GOODPUT.name: max(level[GOODPUT.name] for level in counted),
        GOODPUT_TOKENS.name: max(level[GOODPUT_TOKENS.name] for level in counted),
        THROUGHPUT.name: best_tok_s,
        E2E_THROUGHPUT.name: best_tok_s,
    }
    metrics |= {
        TTFT.name: metrics.get(TTFT_P50, 0.0),
        TTFT_P95: metrics.get(TTFT_P95, 0.0),
        TPOT.name: metrics.get(ITL_P50, 0.0),
        TPOT_P95: metrics.get(ITL_P95, 0.0),
    }
    answered = [record for record in pooled if record.ok] or done
    stats = {
        TTFT.name: Summary.of([record.ttft_s for record in answered]).to_json(),
        "itl_s": Summary.of([gap for record in answered for gap in record.gaps_s] or [0.0]).to_json(),
        "e2e_s": Summary.of([record.e2e_s for record in answered]).to_json(),
    }
    return metrics, stats, per_level
