"""The decode ceiling in the report: a hand-written decoding loop's figures, stored with the study by
`autotune ceiling` (autotune.study.ceilings), beside the study's best decode throughput at the same
batch: a trial's own where it ran that batch alone, the point of its capacity probe at that batch where it probed."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

from autotune.figures.metrics import THROUGHPUT
from autotune.specs import WorkloadSpec
from autotune.study import TrialRecord
from autotune.workloads import KINDS

SHAPE = ("batch_size", "input_len", "output_len")


@dataclass(frozen=True)
class CeilingRow:
    figure: dict[str, Any]  # as stored: batch, shape, dtype, compile mode, tok/s, roofline share, versions
    best: TrialRecord | None  # the study's fastest feasible trial at the figure's batch, where it ran the same shape
    best_tok_s: float | None = None  # that trial's decode throughput at the figure's batch

    @property
    def fraction(self) -> float | None:
        if self.best_tok_s is None:
            return None
        return self.best_tok_s / self.figure["decode_tok_s"]


def ceiling_rows(stored: list[dict[str, Any]], workload: WorkloadSpec, trials: list[TrialRecord]) -> list[CeilingRow]:
    """One row per stored figure, smallest batch first; compared only where the study ran the same workload."""
    measured = [t for t in trials if t.complete and t.feasible and THROUGHPUT.name in t.metrics]
    same_kind = KINDS[workload.kind].times_generate
    rows = []
    for figure in sorted(stored, key=lambda f: tuple(f[key] for key in SHAPE)):
        same_lengths = same_kind and all(figure[key] == getattr(workload, key) for key in SHAPE[1:])
        at_batch = [(t, tok_s) for t in measured if (tok_s := _at_batch(t, figure["batch_size"], workload))]
        best = max(at_batch, key=lambda pair: pair[1], default=None) if same_lengths else None
        rows.append(CeilingRow(figure, *best) if best else CeilingRow(figure, None))
    return rows


def _at_batch(trial: TrialRecord, batch: int, workload: WorkloadSpec) -> float | None:
    """The trial's decode throughput at this batch: its probe's point there, or its own figure where it ran only the
    study's batch."""
    points = trial.capacity.points if trial.capacity is not None else []
    if points:
        found = [p.figures[THROUGHPUT.name] for p in points if p.size == batch and THROUGHPUT.name in p.figures]
        return found[0] if found else None
    return trial.metrics[THROUGHPUT.name] if workload.batch_size == batch else None


def ceiling_section(rows: list[CeilingRow]) -> str:
    """The table, with what it compares; empty when the study has no such figure."""
    if not rows:
        return ""
    lines = [
        "<p>A hand-written greedy loop on this study's model and device: a static cache and one compiled decode step, "
        "with nothing else between tokens (<code>autotune ceiling</code>, as gpt-fast writes it). Where it "
        "ran the study's workload (its tokens in and out, a batch the study measured: a capacity probe's points "
        "included), the fastest feasible trial's decode throughput at that batch is given as a fraction of it.</p>",
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
        best = f"#{row.best.number}: {row.best_tok_s:.1f} tok/s"
        fraction = f"{row.fraction:.2f}x"
    cells = [
        str(figure["batch_size"]),
        f"{figure['input_len']} / {figure['output_len']}",
        f"{figure['dtype']}, compile {figure['compile']}",
        f"{figure['decode_tok_s']:.1f}",
        f"{figure['roofline_fraction']:.1%}",
        best,
        fraction,
        f"{_when(figure)}, torch {figure['torch']}, transformers {figure['transformers']}",
    ]
    return "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells) + "</tr>"


def _when(figure: dict[str, Any]) -> str:
    """When it was measured; where the figure did not say (stored from an older script's JSON), when it was stored."""
    if "measured_at" in figure:
        return figure["measured_at"]
    return f"stored {figure.get('stored_at', '?')}"
