"""The nights' table as text: its headings and each night's cells, for `autotune history` in the terminal and for
its page alike (no HTML, no drawing)."""

from __future__ import annotations

from autotune.analysis.capacity import AtCapacity
from autotune.analysis.history import History, NightSummary
from autotune.figures.metrics import Metric, in_history
from autotune.figures.slo import describe_slo
from autotune.units import format_bytes


def _history_columns() -> dict[str, list[Metric]]:
    """The nights' columns of the figures in_history(), each with the figures it holds (" / " between them)."""
    columns: dict[str, list[Metric]] = {}
    for metric in in_history():
        columns.setdefault(metric.history, []).append(metric)
    return columns


def _column_heading(metrics: list[Metric]) -> str:
    best = "best" if metrics[0].direction == "maximize" else "lowest"
    return f"{best} {' / '.join(metric.column_heading for metric in metrics)}"


HISTORY_COLUMNS = list(_history_columns().values())
FIXED = ("night", "study", "trials", "front", "best tok/s", "lowest memory", "lowest KL")
VERDICT = "vs the night before"
# Without the optional figures (tier 1's, on nights evaluated on a task) and capacities.
HEADINGS = (
    *FIXED,
    *(_column_heading(metrics) for metrics in HISTORY_COLUMNS if not any(m.optional for m in metrics)),
    VERDICT,
)
CAPACITY_HEADINGS = ("SLO", "capacity of the fastest")


def _figure_columns(history: History) -> list[list[Metric]]:
    """The nights' figure columns: an optional figure's only where the nights show it (History.shows)."""
    return [metrics for metrics in HISTORY_COLUMNS if any(map(history.shows, metrics))]


def _probed(history: History) -> bool:
    return any(night.target or night.fastest_capacity for night in history.nights)


def history_headings(history: History) -> tuple[str, ...]:
    """The nights' columns (this page's table and `autotune history`'s); where a night was searched within an SLO,
    the SLO and the fastest point's capacity before the verdict: its row's figures are at capacity within that SLO."""
    figures = tuple(_column_heading(metrics) for metrics in _figure_columns(history))
    return (*FIXED, *figures, *(CAPACITY_HEADINGS if _probed(history) else ()), VERDICT)


def night_cells(history: History, night: NightSummary) -> list[str]:
    """One night's row under history_headings."""
    change = night.best_change(history.before(night))
    cells = [
        night.label,
        night.study,
        str(night.launched),
        str(len(night.points)),
        _number(night.best_throughput, "{:.1f}") + (f" ({change:+.1%})" if change is not None else ""),
        format_bytes(night.lowest_memory_gb * 1e9) if night.lowest_memory_gb is not None else "-",
        _number(night.lowest_kl, "{:.2e}"),
        *(" / ".join(metric.value_text(night.best(metric)) for metric in m) for m in _figure_columns(history)),
    ]
    if _probed(history):
        cells += [describe_slo(night.target.slo) if night.target else "none", _fastest(night.fastest_capacity)]
    return [*cells, night.verdict()]


def _fastest(found: AtCapacity | None) -> str:
    """ "batch 16: 2055 generated tok/s end to end per GPU, $0.137 per 1M tokens"."""
    if found is None or found.size is None or found.tokens_per_s_per_device is None:
        return "-"
    figures = f"{found.tokens_per_s_per_device:.4g} generated tok/s end to end per {found.device}"
    cost = found.cost_per_million_tokens
    return f"{found.unit.size_text(found.size)}: {figures}" + (f", ${cost:.4g} per 1M tokens" if cost else "")


def _number(value: float | None, template: str) -> str:
    return "-" if value is None else template.format(value)
