"""What a figure declares about itself: the Metric type, and the cells, lines and losses every view makes of it.

A metric is data: its name in a trial's figures, label, unit, direction, and how it becomes a loss on the common
scale the Pareto front and the hypervolume use (lower is better; figures that span decades, such as KL, compared on a
log scale). Any metric with a direction can be an objective.

Each metric also says, once, how the rest of autotune treats it: where it is shown (a trial's line, the front's
table, the report's table of trials, a configuration's card) and how its cell is written, whether `compare` and
`history` follow it, the names `--constraint` takes for it, and which expected effect the forecast moves it by. The
figures themselves are the modules beside this one; REPORTED (figures/metrics/__init__.py) holds them in the tables'
order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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
PERCENT = {"cell": "{:.1f}%", "scale": 100.0}  # a share, as a percentage: Metric(..., **PERCENT)


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
