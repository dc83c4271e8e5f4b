"""The decode ceiling in the report: a hand-written decoding loop's figures, stored with the study by
`benchmarks/decode_ceiling.py` (autotune.study.ceilings), beside the study's best decode throughput."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

from autotune.figures.metrics import THROUGHPUT
from autotune.study import TrialRecord
from autotune.workloads import DEFAULT_KIND, KINDS

SHAPE = ("batch_size", "input_len", "output_len")


@dataclass(frozen=True)
class CeilingRow:
    figure: dict[str, Any]  # as stored: batch, shape, dtype, compile mode, tok/s, roofline share, versions
    best: TrialRecord | None  # the study's fastest feasible trial, where the study's workload is the figure's

    @property
    def fraction(self) -> float | None:
        if self.best is None:
            return None
        return self.best.metrics[THROUGHPUT.name] / self.figure["decode_tok_s"]


def ceiling_rows(stored: list[dict[str, Any]], workload: dict[str, Any], trials: list[TrialRecord]) -> list[CeilingRow]:
    """One row per stored figure, smallest batch first; compared only where the study ran the same workload."""
    measured = [t for t in trials if t.complete and t.feasible and THROUGHPUT.name in t.metrics]
    fastest = max(measured, key=lambda t: t.metrics[THROUGHPUT.name], default=None)
    same_shape = KINDS[workload.get("kind", DEFAULT_KIND)].times_generate
    rows = []
    for figure in sorted(stored, key=lambda f: tuple(f[key] for key in SHAPE)):
        comparable = same_shape and all(figure[key] == workload.get(key) for key in SHAPE)
        rows.append(CeilingRow(figure, fastest if comparable else None))
    return rows


def ceiling_section(rows: list[CeilingRow]) -> str:
    """The table, with what it compares; empty when the study has no such figure."""
    if not rows:
        return ""
    lines = [
        "<p>A hand-written greedy loop on this study's model and device: a static cache and one compiled decode step, "
        "with nothing else between tokens (<code>benchmarks/decode_ceiling.py</code>, as gpt-fast writes it). Where it "
        "ran the study's workload, the fastest feasible trial's decode throughput is given as a fraction of it.</p>",
        "<table class='ceiling'><tr><th>batch</th><th>tokens in / out</th><th>hand loop</th><th>decode tok/s</th>"
        "<th>roofline</th><th>fastest trial</th><th>of the ceiling</th><th>measured</th></tr>",
    ]
    lines += [_row(row) for row in rows]
    return "\n".join([*lines, "</table>"])


def _row(row: CeilingRow) -> str:
    figure = row.figure
    if row.best is None:
        best, fraction = "another workload", "–"
    else:
        best = f"#{row.best.number}: {row.best.metrics[THROUGHPUT.name]:.1f} tok/s"
        fraction = f"{row.fraction:.2f}x"
    cells = [
        str(figure["batch_size"]),
        f"{figure['input_len']} / {figure['output_len']}",
        f"{figure['dtype']}, compile {figure['compile']}",
        f"{figure['decode_tok_s']:.1f}",
        f"{figure['roofline_fraction']:.1%}",
        best,
        fraction,
        f"{figure.get('measured_at', '?')}, torch {figure['torch']}, transformers {figure['transformers']}",
    ]
    return "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells) + "</tr>"
