"""The figures a trial reports, by name, and the objectives a study optimises (by default three of them).

A figure is a Metric (metric.py): data that says, once, how the rest of autotune treats it. Each is written in the
module of what it measures: speed.py (speed and latency, what a token costs), memory.py, quality.py (against the
reference, tier 0 included), task.py (tier 1), replay.py (a request trace replayed) and load.py (the serve workload, a
load level, the capacity). REPORTED holds them in the order of every table: the trial line, the front's table, the
report's table and cards, `best`, `compare`, `history`, the constraints and the forecast build their lists from it.
Adding a figure is one Metric in the module of what it measures, and its place in REPORTED.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autotune.figures.metrics.load import (
    CAPACITY,
    ERRORS,
    GOODPUT,
    IN_FLIGHT_PEAK,
    MEETS_SLO_FIGURE,
    OUTPUT_TOK_S,
    REQUESTS,
    REQUESTS_PER_S,
    SLO_SHARE,
)
from autotune.figures.metrics.memory import (
    PEAK_MEMORY,
    PEAK_MEMORY_BYTES,
)
from autotune.figures.metrics.metric import (
    BYTES,
    COLUMN,
    FRONT,
    KEPT,
    PERCENT,
    REPORT,
    WHERE_MEASURED,
    Compared,
    Direction,
    Family,
    Metric,
    Shown,
)
from autotune.figures.metrics.quality import (
    DEGENERATE_SHARE,
    GENERATIONS_JUDGED,
    GREEDY_AGREEMENT,
    GREEDY_TOKENS,
    KL_DIVERGENCE,
    KL_FLOOR,
    PERPLEXITY,
    PERPLEXITY_DELTA,
    TOKEN_AGREEMENT,
    TOP1_AGREEMENT,
)
from autotune.figures.metrics.replay import (
    GOODPUT_TOKENS,
    PREFIX_HIT_RATE,
    REQUESTS_SERVED,
    TOKENS_GENERATED,
    WASTED_SHARE,
)
from autotune.figures.metrics.speed import (
    ACHIEVED_BANDWIDTH,
    COST_PER_MILLION_TOKENS,
    E2E_P95,
    E2E_THROUGHPUT,
    ENERGY_PER_TOKEN,
    FIRST_CALL_S,
    FORECAST_QUANTILES,
    ITL_P50,
    ITL_P95,
    LATENCY_FIGURES,
    LATENCY_PERCENTILES,
    LATENCY_QUANTILES,
    ROOFLINE_FRACTION,
    THROUGHPUT,
    THROUGHPUT_CV,
    TP_RANKS,
    TPOT,
    TPOT_P95,
    TTFT,
    TTFT_P50,
    TTFT_P95,
    WARMUP,
    percentile_name,
)
from autotune.figures.metrics.task import (
    ON_THE_TASK,
    TASK_ACCURACY,
    TASK_FLIPS,
    TASK_ITEMS,
    TASK_RECOVERY,
    TASK_RECOVERY_LOW,
)

# The default objectives, in the order Optuna stores their values: every study before issue 17 has these.
OBJECTIVES: tuple[Metric, ...] = (THROUGHPUT, PEAK_MEMORY, KL_DIVERGENCE)

# Every figure a trial reports, in the order of every table that shows it: a column's place, a line's, a card's.
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
    DEGENERATE_SHARE,
    GOODPUT_TOKENS,
    WASTED_SHARE,
    PREFIX_HIT_RATE,
    REQUESTS_SERVED,
    TOKENS_GENERATED,
    TASK_ACCURACY,
    TASK_RECOVERY,
    TASK_RECOVERY_LOW,
    TASK_FLIPS,
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
    *LATENCY_PERCENTILES,
    ENERGY_PER_TOKEN,
    CAPACITY,
    MEETS_SLO_FIGURE,
)

METRICS: dict[str, Metric] = {metric.name: metric for metric in REPORTED}


def objectives_named(names: Sequence[str]) -> tuple[Metric, ...]:
    """The metrics a study optimises, from their names as its settings store them."""
    unknown = [name for name in names if name not in METRICS or METRICS[name].direction is None]
    if unknown:
        raise ValueError(f"not an objective: {', '.join(unknown)}; known: {', '.join(OBJECTIVE_CHOICES)}")
    return tuple(METRICS[name] for name in names)


OBJECTIVE_CHOICES = tuple(name for name, metric in METRICS.items() if metric.direction is not None)


def shown_in(where: Shown, rows: Sequence[Mapping[str, float]] | None = None) -> tuple[Metric, ...]:
    """The figures of a table, in its order: FRONT, those of a trial's line and the front's table; REPORT, those of
    the report's table of trials (the front's and its own). With the table's `rows` (each a trial's figures), an
    optional figure only where some row measured it."""
    wanted = (FRONT,) if where == FRONT else (FRONT, REPORT)
    return tuple(
        metric
        for metric in REPORTED
        if metric.shown in wanted and (rows is None or not metric.optional or any(map(metric.measured, rows)))
    )


def compared() -> tuple[Metric, ...]:
    """The figures whose change `compare` follows, in its order."""
    return tuple(metric for metric in REPORTED if metric.compared is not None)


def in_history() -> tuple[Metric, ...]:
    """The figures each night's front is summed up by besides throughput, memory and KL, in the nights' table."""
    return tuple(metric for metric in REPORTED if metric.history)


def after_search() -> tuple[Metric, ...]:
    """The figures measured after a search on its finalists (tier 1): a search cannot bound them."""
    return tuple(metric for metric in REPORTED if metric.after_search)


def on_cards() -> tuple[Metric, ...]:
    return tuple(metric for metric in REPORTED if metric.card)


def constraint_names() -> dict[str, tuple[str, str]]:
    """The names --constraint takes besides the figures' own -> (figure, the unit a bare number is in)."""
    return {alias: (metric.name, unit) for metric in REPORTED for alias, unit in metric.aliases}


__all__ = [
    "ACHIEVED_BANDWIDTH",
    "BYTES",
    "CAPACITY",
    "COLUMN",
    "COST_PER_MILLION_TOKENS",
    "DEGENERATE_SHARE",
    "E2E_P95",
    "E2E_THROUGHPUT",
    "ENERGY_PER_TOKEN",
    "ERRORS",
    "FIRST_CALL_S",
    "FORECAST_QUANTILES",
    "FRONT",
    "GENERATIONS_JUDGED",
    "GOODPUT",
    "GOODPUT_TOKENS",
    "GREEDY_AGREEMENT",
    "GREEDY_TOKENS",
    "IN_FLIGHT_PEAK",
    "ITL_P50",
    "ITL_P95",
    "KEPT",
    "KL_DIVERGENCE",
    "KL_FLOOR",
    "LATENCY_FIGURES",
    "LATENCY_PERCENTILES",
    "LATENCY_QUANTILES",
    "MEETS_SLO_FIGURE",
    "METRICS",
    "OBJECTIVES",
    "OBJECTIVE_CHOICES",
    "ON_THE_TASK",
    "OUTPUT_TOK_S",
    "PEAK_MEMORY",
    "PEAK_MEMORY_BYTES",
    "PERCENT",
    "PERPLEXITY",
    "PERPLEXITY_DELTA",
    "PREFIX_HIT_RATE",
    "REPORT",
    "REPORTED",
    "REQUESTS",
    "REQUESTS_PER_S",
    "REQUESTS_SERVED",
    "ROOFLINE_FRACTION",
    "SLO_SHARE",
    "TASK_ACCURACY",
    "TASK_FLIPS",
    "TASK_ITEMS",
    "TASK_RECOVERY",
    "TASK_RECOVERY_LOW",
    "THROUGHPUT",
    "THROUGHPUT_CV",
    "TOKENS_GENERATED",
    "TOKEN_AGREEMENT",
    "TOP1_AGREEMENT",
    "TPOT",
    "TPOT_P95",
    "TP_RANKS",
    "TTFT",
    "TTFT_P50",
    "TTFT_P95",
    "WARMUP",
    "WASTED_SHARE",
    "WHERE_MEASURED",
    "Compared",
    "Direction",
    "Family",
    "Metric",
    "Shown",
    "after_search",
    "compared",
    "constraint_names",
    "in_history",
    "objectives_named",
    "on_cards",
    "percentile_name",
    "shown_in",
]
