"""The figures a trial reports, and the objectives a study optimises (by default three of them).

A metric is data: its name in a trial's figures, label, unit, direction, and how it becomes a loss
on the common scale the Pareto front and the hypervolume use (lower is better; figures that span
decades, such as KL, compared on a log scale). Any metric with a direction can be an objective.

Each metric also says, once, how the rest of autotune treats it: where it is shown (a trial's line, the front's
table, the report's table of trials, a configuration's card) and how its cell is written, whether `compare` and
`history` follow it, the names `--constraint` takes for it, and which expected effect the forecast moves it by.
Every table of figures is built from REPORTED by these fields: adding a figure is one entry here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from autotune.units import format_bytes

Direction = Literal["maximize", "minimize"]
# Where a figure is shown: FRONT, in a trial's line, the front's table and the report's table of trials; REPORT, in
# the report's table of trials only.
Shown = Literal["front", "report"]
FRONT: Shown = "front"
REPORT: Shown = "report"
# How `compare` follows it: COLUMN, its change in a column and in the JSON; WHERE_MEASURED, the same, the column only
# where either study measured it; KEPT, its change in the JSON only.
Compared = Literal["column", "where measured", "kept"]
COLUMN: Compared = "column"
WHERE_MEASURED: Compared = "where measured"
KEPT: Compared = "kept"
# Which expected effect of a knob moves it in the forecast (strategy/forecast.py): speed (higher is faster), time
# (lower is faster), memory, kl.
Family = Literal["speed", "time", "memory", "kl"]
BYTES = "bytes"  # a cell written as a size (format_bytes)


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str
    direction: Direction | None = None
    log_floor: float | None = None  # compared as log10(max(value, floor)): it spans decades
    short: str = ""  # its name in table headers and legends
    axis: str = ""  # its axis title in the report's charts, on the scale it is compared on
    # shown
    shown: Shown | None = None
    column: str = ""  # its heading in tables (the front's, the report's, compare's); "": its heading
    cell: str = ""  # a table cell: a template over the value times `scale` ("{:.1f} ms"), or BYTES
    scale: float = 1.0
    cell_of: str = ""  # the figure the cell writes, where another one says it better (peak memory in bytes)
    beside: str = ""  # a figure written beside the cell, where measured, as `beside_form` says: "12.5% of 8"
    beside_form: str = " of {:.0f}"
    optional: bool = False  # a table has its column only where some row measured it
    line: str = ""  # its part of a trial's line, "{}" its cell; "": "<column> <cell>"
    card: str = ""  # its words on a configuration's card, "{}" its cell, after the clause `card_clause`
    card_clause: str = ""
    on_path: bool = False  # teacher-forced: it depends on the path quality was measured on (figures/quality.py)
    # compared, constrained, forecast
    compared: Compared | None = None
    after_search: bool = False  # measured after the search, on the front's finalists (tier 1): no search bound
    history: str = ""  # history: each night's best on its front, in the nights' column of this name (shared: " / ")
    history_with: str = ""  # history shows it only for series where some night measured this figure too
    aliases: tuple[tuple[str, str], ...] = ()  # names --constraint takes, each with the unit a bare number is in
    forecast: Family | None = None

    @property
    def heading(self) -> str:
        return self.short or self.label

    @property
    def column_heading(self) -> str:
        return self.column or self.heading

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

    def value_text(self, value: float | None) -> str:
        """A value as its table cell writes it; "-" for none."""
        if value is None:
            return "-"
        return format_bytes(value) if self.cell == BYTES else self.cell.format(value * self.scale)

    def text(self, figures: Mapping[str, float]) -> str:
        """Its cell, from a trial's figures ("12.5% of 8" with the count beside it); "-" where it was not measured."""
        cell = self.value_text(figures.get(self.cell_of or self.name))
        count = figures.get(self.beside) if self.beside and cell != "-" else None
        return cell if count is None else cell + self.beside_form.format(count)

    def measured(self, figures: Mapping[str, float]) -> bool:
        return (self.cell_of or self.name) in figures

    def line_text(self, figures: Mapping[str, float]) -> str:
        """Its part of a trial's line: "ttft 44.1 ms"."""
        return (self.line or f"{self.column_heading} {{}}").format(self.text(figures))


PERCENT = {"cell": "{:.1f}%", "scale": 100.0}  # a share, as a percentage
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
PEAK_MEMORY_BYTES = "peak_memory_bytes"  # peak memory in bytes: PEAK_MEMORY is the same in GB
PEAK_MEMORY = Metric(
    "peak_memory_gb",
    "peak memory",
    "GB",
    "minimize",
    short="peak memory",
    axis="peak memory (GB)",
    shown=FRONT,
    column="memory",
    cell=BYTES,
    cell_of=PEAK_MEMORY_BYTES,
    line="{}",
    compared=COLUMN,
    aliases=(("memory", "gb"), ("mem", "gb"), ("peak_memory", "gb")),
    forecast="memory",
)
KL_FLOOR = 1e-6  # the reference's KL is 0; below this, KL is noise around zero
KL_DIVERGENCE = Metric(
    "kl_divergence",
    "KL divergence vs reference",
    "nats/token",
    "minimize",
    KL_FLOOR,
    short="KL",
    axis="log10 KL",
    shown=FRONT,
    cell="{:.2e}",
    on_path=True,
    compared=COLUMN,
    aliases=(("kl", ""),),
    forecast="kl",
)

TOP1_AGREEMENT = Metric(
    "top1_agreement",
    "top-1 agreement with reference",
    "",
    "maximize",
    short="top-1",
    shown=FRONT,
    **PERCENT,
    on_path=True,
    aliases=(("top1", ""),),
)
# The reference's greedy continuations of the workload's prompts: the share of each that the trial's own outputs
# reproduced before diverging (greedy), and the share of positions where the trial, forced along them, puts the
# reference's token first (token: one early flip costs one position).
GREEDY_TOKENS = "with the reference's greedy tokens"
TOKEN_AGREEMENT = Metric(
    "token_agreement",
    "token agreement with reference",
    "",
    "maximize",
    short="tokens",
    shown=FRONT,
    **PERCENT,
    card="token agreement {}",
    card_clause=GREEDY_TOKENS,
    on_path=True,
    compared=COLUMN,
    history="agreements",
    aliases=(("tokens", ""),),
)
GREEDY_AGREEMENT = Metric(
    "greedy_agreement",
    "greedy agreement with reference",
    "",
    "maximize",
    short="greedy",
    shown=FRONT,
    **PERCENT,
    card="greedy agreement {}",
    card_clause=GREEDY_TOKENS,
    history="agreements",
    aliases=(("greedy", ""),),
)

# Tier 0, every trial: of the trial's own free-running generations, the share that are degenerate (empty, one token,
# a repetition loop, or running to the limit where the reference stopped) where the reference's are not.
GENERATIONS_JUDGED = "generations_judged"  # how many generations tier 0 judged
DEGENERATE_SHARE = Metric(
    "degenerate_share",
    "degenerate generations",
    "",
    "minimize",
    short="degenerate",
    shown=FRONT,
    **PERCENT,
    beside=GENERATIONS_JUDGED,
    optional=True,
    card="degenerate {}",
    card_clause="of its own free-running generations",
    compared=WHERE_MEASURED,
    history="degenerate",
    history_with="task_accuracy",  # tier 0 beside tier 1, on nights gated on the task (as before them, without)
    aliases=(("degenerate", ""),),
)

# Tier 1, the front's finalists (--eval TASK): the task's accuracy, its recovery against the reference's with a
# one-sided 95% lower bound (paired: the items are the reference's; figures/task.py says which bound and why), and
# the share of items right in one and wrong in the other.
TASK_ITEMS = "task_items"  # how many items of the task were judged
ON_THE_TASK = "on the task"
TASK_ACCURACY = Metric(
    "task_accuracy",
    "task accuracy",
    "",
    "maximize",
    short="accuracy",
    shown=FRONT,
    **PERCENT,
    beside=TASK_ITEMS,
    optional=True,
    card="accuracy {}",
    card_clause=ON_THE_TASK,
    compared=WHERE_MEASURED,
    after_search=True,
    history="accuracy",
    aliases=(("accuracy", ""),),
)
TASK_RECOVERY_LOW = Metric(
    "task_recovery_low",
    "task recovery, one-sided 95% lower bound",
    "",
    "maximize",
    after_search=True,
    aliases=(("recovery_low", ""),),
)
TASK_RECOVERY = Metric(
    "task_recovery",
    "task recovery: accuracy over the reference's",
    "",
    "maximize",
    short="recovery",
    shown=FRONT,
    **PERCENT,
    beside=TASK_RECOVERY_LOW.name,
    beside_form=" (>={:.1%})",
    optional=True,
    card="recovery {}",
    card_clause=ON_THE_TASK,
    compared=WHERE_MEASURED,
    after_search=True,
    aliases=(("recovery", ""),),
)
TASK_FLIPS = Metric(
    "task_flips",
    "answer flips vs reference",
    "",
    "minimize",
    short="flips",
    shown=FRONT,
    **PERCENT,
    beside=TASK_ITEMS,
    optional=True,
    card="flips {}",
    card_clause=ON_THE_TASK,
    compared=WHERE_MEASURED,
    after_search=True,
    history="flips",
    aliases=(("flips", ""),),
)

# A request trace replayed (--traffic): the tokens its requests asked for, per second of the replay, of those that met
# the SLO (all of them without one: what static batching ran past a request's end does not count); the share of
# generate()'s decode steps spent on rows whose request had ended; how much each replay served; the share of input
# tokens read from a prefix a cache reused.
GOODPUT_TOKENS = Metric(
    "goodput_tok_s",
    "goodput: requested tokens/s within the SLO",
    "tok/s",
    "maximize",
    short="goodput",
    shown=FRONT,
    column="goodput tok/s",
    cell="{:.1f}",
    optional=True,
    line="goodput {} tok/s",
    compared=WHERE_MEASURED,
    aliases=(("goodput_tokens", "tok/s"),),
    forecast="speed",
)
WASTED_SHARE = Metric(
    "wasted_share",
    "decode steps on rows whose request had ended",
    "",
    "minimize",
    short="wasted",
    shown=FRONT,
    **PERCENT,
    optional=True,
    line="wasted {} of decode steps",
    compared=WHERE_MEASURED,
    aliases=(("wasted", ""),),
)
REQUESTS_SERVED = Metric("requests_served", "trace requests served per replay", "")
TOKENS_GENERATED = Metric("tokens_generated", "tokens the trace's requests asked for and received, per replay", "")
PREFIX_HIT_RATE = Metric(
    "prefix_hit_rate",
    "share of input tokens read from a reused prefix",
    "",
    "maximize",
    short="prefix hits",
    shown=REPORT,
    **PERCENT,
    optional=True,
    compared=WHERE_MEASURED,
    aliases=(("prefix_hits", ""),),
)

# The default objectives, in the order Optuna stores their values: every study before issue 17 has these.
OBJECTIVES: tuple[Metric, ...] = (THROUGHPUT, PEAK_MEMORY, KL_DIVERGENCE)

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
PERPLEXITY = Metric(
    "perplexity", "perplexity", "", "minimize", shown=REPORT, column="ppl", cell="{:.2f}", on_path=True,
    aliases=(("ppl", ""),),
)  # fmt: skip
PERPLEXITY_DELTA = Metric(
    "perplexity_delta", "perplexity change vs reference", "", "minimize", on_path=True, aliases=(("ppl_delta", ""),)
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
# the serve workload (transformers serve under load)
GOODPUT = Metric(
    "goodput_req_s", "goodput: requests/s within the SLOs", "req/s", "maximize",
    aliases=(("goodput", "req/s"),), forecast="speed",
)  # fmt: skip
REQUESTS_PER_S = Metric(
    "requests_per_s", "completed requests per second", "req/s", "maximize",
    aliases=(("req_s", "req/s"),), forecast="speed",
)  # fmt: skip
ERRORS = Metric("errors", "failed requests", "", "minimize")
ENERGY_PER_TOKEN = Metric(
    "energy_j_per_token", "GPU energy per generated token", "J", "minimize", aliases=(("energy", "j"),),
    forecast="time",
)  # fmt: skip
# capacity: the largest batch or load within the SLO (autotune/figures/capacity.py)
CAPACITY = Metric(
    "capacity", "capacity: the largest batch or load within the SLO", "", "maximize", column="capacity",
    compared=WHERE_MEASURED,
)  # fmt: skip
MEETS_SLO_FIGURE = Metric("meets_slo", "meets the SLO at some batch or load (1 yes, 0 no)", "")

LATENCY_FIGURES = {"ttft": "time to first token", "itl": "inter-token latency", "e2e": "request latency"}
LATENCY_QUANTILES = (50, 90, 95, 99)


def percentile_name(figure: str, q: int) -> str:
    """The name of a latency percentile: ("itl", 95) -> "itl_p95_s"."""
    return f"{figure}_p{q}_s"


def _percentile_family(q: int) -> Family | None:
    """The forecast moves the p50, p95 and p99 of latency with a knob's expected speed (the p90 never was)."""
    return "time" if q in FORECAST_QUANTILES else None


FORECAST_QUANTILES = (50, 95, 99)

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
    *(
        Metric(percentile_name(figure, q), f"{label} (p{q})", "s", "minimize", forecast=_percentile_family(q))
        for figure, label in LATENCY_FIGURES.items()
        for q in LATENCY_QUANTILES
    ),
    ENERGY_PER_TOKEN,
    CAPACITY,
    MEETS_SLO_FIGURE,
)

# Figures a trial or a point of a capacity probe reports that are no metric of a study (no label, never an objective).
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
