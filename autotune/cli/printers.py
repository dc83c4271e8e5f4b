"""What the commands print: progress lines, tables and JSON documents. Nothing here decides anything."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from itertools import count, takewhile
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from autotune.cli.progress import ProgressDisplay
from autotune.figures.constraints import MEETS_SLO, Constraint
from autotune.figures.metrics import (
    CAPACITY,
    ERRORS,
    GOODPUT,
    GREEDY_AGREEMENT,
    KL_DIVERGENCE,
    OBJECTIVES,
    OUTPUT_TOK_S,
    PEAK_MEMORY,
    PEAK_MEMORY_BYTES,
    REQUESTS,
    REQUESTS_PER_S,
    SLO_SHARE,
    THROUGHPUT,
    TOKEN_AGREEMENT,
    TOP1_AGREEMENT,
    TTFT,
    Metric,
)
from autotune.figures.quality import ON_THE_PATH, PATHS, path_lines, path_note
from autotune.figures.slo import describe_slo, in_ms
from autotune.space import Config
from autotune.space.knobs import short_name
from autotune.units import format_bytes, format_duration

if TYPE_CHECKING:
    from pathlib import Path

    from autotune.analysis.capacity import AtCapacity
    from autotune.analysis.compare import Comparison, Level, Tolerances
    from autotune.analysis.found import BestFound
    from autotune.analysis.history import FrontPoint, History
    from autotune.profiles import DetectedDevice
    from autotune.report.best import Best
    from autotune.report.cards import DeployCard
    from autotune.report.data import ParetoCard
    from autotune.search.dry_run import DryRun
    from autotune.search.events import SearchSummary
    from autotune.search.finish import Finished
    from autotune.study import TrialRecord
    from autotune.workloads.capacity import Capacity, Point

out = Console(highlight=False, markup=False, soft_wrap=True)
if not out.is_terminal:  # piped or logged: do not squeeze tables into 80 columns
    out.width = 200


def knobs_line(config: Config) -> str:

    return " ".join(f"{short_name(name)}={value}" for name, value in config.items())


def changes_line(config: Config, baseline: Config) -> str:
    """The knobs whose value differs from the baseline's ("baseline" when none does)."""
    changed = {name: value for name, value in config.items() if baseline.get(name) != value}
    return knobs_line(changed) if changed else "baseline"


class TrialPrinter:
    """One line per finished trial; what runs now, with elapsed time (autotune.cli.progress)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.display = ProgressDisplay(console)

    def note(self, message: str) -> None:
        self.console.print(f"note: {message}")

    def progress(self, what: str) -> None:
        self.display.show(what)

    def trial_started(self, number: int, config: Config, roles: list[str]) -> None:
        self.display.show(f"trial #{number}: {knobs_line(config)}")

    def trial_finished(self, record: TrialRecord) -> None:
        self.display.clear()
        roles = ",".join(record.roles)
        label = f"#{record.number}" + (f" [{roles}]" if roles else "")
        self.console.print(f"{label} {knobs_line(record.config)} -> {_figures(record)} ({_duration(record)})")
        if record.capacity is not None:
            for line in capacity_lines(record.capacity):
                self.console.print(f"    {line}")


def _figures(record: TrialRecord) -> str:
    if not record.complete:
        first_line = (record.message or "").splitlines()[0] if record.message else ""
        return f"{record.outcome}: {first_line[:160]}"
    m = record.metrics
    return (
        (
            f"ok {m[THROUGHPUT.name]:.1f} tok/s, ttft {m[TTFT.name] * 1000:.1f} ms, "
            f"{format_bytes(m[PEAK_MEMORY_BYTES])}, {agreement_figures(m)}"
        )
        + _serve_figures(m)
        + _path_note(record.quality_path)
    )


def agreement_figures(m: dict[str, float]) -> str:
    """The quality figures: KL, top-1, and the agreements with the reference's greedy tokens where measured."""
    shown = [f"KL {m[KL_DIVERGENCE.name]:.2e}", f"top-1 {_percent(m.get(TOP1_AGREEMENT.name))}"]
    shown += [f"{metric.heading} {_percent(m[metric.name])}" for metric in AGREEMENTS if metric.name in m]
    return ", ".join(shown)


AGREEMENTS = (TOKEN_AGREEMENT, GREEDY_AGREEMENT)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _path_note(path: str) -> str:
    note = path_note(path)
    return f" [{note}]" if note else ""


def capacity_lines(capacity: Capacity) -> list[str]:
    """A probe's points, one line each, then what it found: "batch 16: 5134 tok/s, itl_p95 14 ms, 66.7 MB, met"."""
    unit, slo = capacity.unit.name, capacity.slo
    lines = [_point_line(unit, point, slo) for point in capacity.points]
    within = f" within {describe_slo(slo)}" if slo else ""
    return [*lines, f"capacity{within}: {capacity.found()}"]


def _point_line(unit: str, point: Point, slo: dict[str, float]) -> str:
    figures = point.figures
    tok_s = figures.get(THROUGHPUT.name, figures.get(OUTPUT_TOK_S))  # a load level: the server's output tokens/s
    shown = [f"{tok_s:.1f} tok/s"] if tok_s is not None else []
    if SLO_SHARE in figures:  # a load level: judged by the share of its requests within the SLO
        shown += [
            f"{figures[REQUESTS_PER_S.name]:.2f} req/s, goodput {figures[GOODPUT.name]:.2f} req/s",
            f"{figures[SLO_SHARE]:.0%} of requests within the SLO",
        ]
    shown += [f"{name.removesuffix('_s')} {in_ms(figures[name])}" for name in slo if name in figures]
    if PEAK_MEMORY_BYTES in figures:
        shown.append(format_bytes(figures[PEAK_MEMORY_BYTES]))
    verdict = "met the SLO" if point.verdict == "met" else f"refused: {point.reason}"
    return f"{unit} {point.size:g}: {', '.join([*shown, verdict])}"


def _serve_figures(m: dict[str, float]) -> str:
    if GOODPUT.name not in m:
        return ""
    failed = f"{m[ERRORS.name]:.0f} failed" + (f" of {m[REQUESTS]:.0f} requests" if REQUESTS in m else "")
    return f", {m[REQUESTS_PER_S.name]:.2f} req/s, goodput {m[GOODPUT.name]:.2f} req/s, {failed}"


def _duration(record: TrialRecord) -> str:
    return format_duration(record.duration_s) if record.duration_s is not None else "-"


# ------------------------------------------------------------------------------------ search, worker


def print_search_summary(summary: SearchSummary, capacity_within: str = "", quality_at_capacity: bool = True) -> None:
    """`capacity_within`: "within itl_p95<=6ms" where the trials' figures are at their capacity within an SLO;
    `quality_at_capacity`: the quality figures too (decoded at that batch), not a serve trial's (one prompt)."""
    out.print(
        f"study {summary.study_name}: {summary.launched} trials in {format_duration(summary.elapsed_s)} "
        f"({summary.stop_reason})"
    )
    spent = ", ".join(
        f"{name} {format_duration(seconds)}" for name, seconds in summary.spent_s.items() if seconds >= 0.05
    )
    out.print(f"time spent: {spent}")
    for found in summary.best:
        at_capacity = quality_at_capacity or found.metric.name not in ON_THE_PATH
        at = f" at its capacity {capacity_within}" if capacity_within and at_capacity else ""
        out.print(f"best {found.metric.label}: {_best_figure(found)}{at}, {_found_when(found)}")
    if summary.passed_over:
        listed = "; ".join(summary.passed_over)
        out.print(f"not started, the budget left could not finish them: {listed}")


def _best_figure(found: BestFound) -> str:
    if found.metric.name == PEAK_MEMORY.name:
        return format_bytes(found.value * 1e9)
    return _figure(found.metric, found.value)


def _found_when(found: BestFound) -> str:
    if found.minutes is None:
        return f"trial #{found.number}"
    run = f" (search run {found.run})" if found.run and found.run > 1 else ""
    return f"found by trial #{found.number}, {found.minutes:.1f} min into the search{run}"


def print_dry_run(run: DryRun, as_json: bool) -> None:
    """The planned first trials: each one's expected time (in plain trials), why it runs, what it changes."""
    if as_json:
        print(run.to_json())
        return
    profile = run.profile
    out.print(
        f"dry run on {profile.name} ({profile.description}): checkpoint dtype {run.checkpoint}; nothing runs and no "
        "study is created. Each trial is planned as if the one before measured what the guides lead one to expect "
        "(the knobs' priors): a real search changes course as soon as a trial measures something else."
    )
    table = Table(title=f"the first {len(run.trials)} trials")
    columns = (
        "#",
        "time",
        "at most",
        "why",
        "configuration (the anchors in full, the rest as changes from the baseline)",
    )
    for column in columns:
        table.add_column(column)
    for number, trial in enumerate(run.trials):
        anchor = trial.why in ("reference", "baseline", "reference and baseline")
        shown = trial.config if anchor else _changes(trial.config, run.baseline)
        at_most = f"{trial.at_most:.1f}x" if trial.at_most is not None else "-"
        row = (f"{trial.relative_seconds:.1f}x", at_most, trial.why, knobs_line(shown) or "(none)")
        table.add_row(str(number), *row)
    out.print(table)
    out.print(
        "time: the trial's expected duration against a plain one (the baseline's kind); at most: the longest it may "
        "take, which must fit in the budget left for it to start (docs/search-strategy.md)"
    )
    if run.probe:
        out.print(run.probe)
    if run.sampler_next:
        out.print("then Optuna's sampler proposes the rest (study.make_sampler)")
    else:
        out.print(f"the strategy plans more after these {len(run.trials)}: give --trials N to list N")


def _changes(config: Config, baseline: Config) -> Config:
    changed = {name: value for name, value in config.items() if baseline.get(name) != value}
    return changed | {name: "-" for name in baseline if name not in config}


def print_worker_summary(summary: SearchSummary) -> None:
    out.print(
        f"worker on study {summary.study_name}: {summary.launched} trials in "
        f"{format_duration(summary.elapsed_s)} ({summary.stop_reason})"
    )


def print_finished(finished: Finished) -> None:
    """After a search: its front (or why it is empty), the report, and where the artifacts are."""
    name = finished.summary.study_name
    if finished.front:
        print_front(name, finished.front, finished.objectives, finished.baseline)
    else:
        out.print(f"Pareto front of {name}: empty, {finished.empty_front_reason}")
    out.print(f"report: {finished.report}")
    if finished.artifacts:
        out.print(f"trial logs and the report are stored as Optuna artifacts in {finished.artifacts}")


SHOWN_IN_FRONT = {THROUGHPUT.name, TTFT.name, PEAK_MEMORY.name, KL_DIVERGENCE.name, TOP1_AGREEMENT.name} | {
    metric.name for metric in AGREEMENTS
}


def print_front(
    study_name: str, cards: list[ParetoCard], objectives: Sequence[Metric] = OBJECTIVES, baseline: Config | None = None
) -> None:
    """The front's figures, each configuration as its changes from the baseline, and a column for each of the
    study's objectives the usual ones leave out."""
    extra = [metric for metric in objectives if metric.name not in SHOWN_IN_FRONT]
    title = f"Pareto front of {study_name}" + (f" (baseline: {knobs_line(baseline)})" if baseline else "")
    probed = next((card.at_capacity for card in cards if card.at_capacity is not None), None)
    if probed is not None:
        title += f", each at its capacity {probed.target.within}"
        missed = cards[0].baseline_capacity
        if missed is not None and missed.size is None:
            title += f"; the baseline meets it at no {missed.unit.name}: vs baseline compares with its figures past it"
    table = Table(title=title)
    changes = "changes from the baseline" if baseline else "configuration"
    for column in ("#", changes, *(["capacity"] if probed else []), "tok/s", "vs baseline", "ttft", "memory"):
        table.add_column(column)
    for column in ("KL", "top-1", *(metric.heading for metric in AGREEMENTS)):
        table.add_column(column)
    for metric in extra:
        table.add_column(metric.heading)
    for card in cards:
        m = card.record.metrics
        found = card.at_capacity
        table.add_row(
            str(card.record.number),
            changes_line(card.record.config, baseline) if baseline else knobs_line(card.record.config),
            *([found.unit.size_text(found.size) if found and found.size is not None else "-"] if probed else []),
            f"{m[THROUGHPUT.name]:.1f}",
            f"{card.speedup:.2f}x" if card.speedup else "-",
            f"{m[TTFT.name] * 1000:.1f} ms",
            format_bytes(m[PEAK_MEMORY_BYTES]),
            f"{m[KL_DIVERGENCE.name]:.2e}",
            _percent(m.get(TOP1_AGREEMENT.name)),
            *(_percent(m.get(metric.name)) for metric in AGREEMENTS),
            *(_figure(metric, m.get(metric.name)) for metric in extra),
        )
    out.print(table)
    for line in path_lines((card.record.number, card.record.quality_path) for card in cards):
        out.print(line)


def _figure(metric: Metric, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.2f} ms" if metric.unit == "s" else f"{value:.4g} {metric.unit}".rstrip()


# ------------------------------------------------------------------------------------ measure


def print_measurement(document: dict[str, Any], as_json: bool, capacity: Capacity | None = None) -> None:
    """`autotune measure`: its document as JSON, or its figures as a table, then its capacity probe's lines."""
    if as_json:
        print(json.dumps(document))
        return
    out.print(f"{knobs_line(document['config'])} -> {document['outcome']} {document['message']}".rstrip())
    table = Table(title="figures (p50, p95, coefficient of variation, repeats)")
    for column in ("figure", "p50", "p95", "cv", "n"):
        table.add_column(column)
    for name, summary in document["stats"].items():
        table.add_row(name, f"{summary['p50']:.6g}", f"{summary['p95']:.6g}", f"{summary['cv']:.2%}", str(summary["n"]))
    out.print(table)
    for name in sorted(document["metrics"]):
        if name not in document["stats"]:
            out.print(f"{name}: {document['metrics'][name]:.6g}")
    for line in capacity_lines(capacity) if capacity is not None else []:
        out.print(line)
    if document.get("quality_path"):
        out.print(f"quality measured {PATHS[document['quality_path']]}")


# ------------------------------------------------------------------------------------ compare


MOVED_FIGURES = {
    THROUGHPUT.name: "tok/s",
    TTFT.name: "ttft",
    PEAK_MEMORY.name: "memory",
    KL_DIVERGENCE.name: "KL",
    TOKEN_AGREEMENT.name: TOKEN_AGREEMENT.heading,
}


def _moved_columns(comparison: Comparison) -> dict[str, str]:
    """The figures whose change the table shows, capacity where either study probed one."""
    probed = any(CAPACITY.name in (m.before or {}) or CAPACITY.name in (m.after or {}) for m in comparison.movements)
    return MOVED_FIGURES | ({CAPACITY.name: "capacity"} if probed else {})


def print_comparison(study_a: str, study_b: str, comparison: Comparison, output: str = "table") -> None:
    """As a table (default), one JSON document, or Markdown (a CI job's summary page)."""
    if output == "json":
        print(json.dumps(_comparison_document(study_a, study_b, comparison)))
        return
    if output == "markdown":
        print(comparison_markdown(study_a, study_b, comparison))
        return
    columns = _moved_columns(comparison)
    table = Table(title=f"{study_a} -> {study_b}: figures of the configurations on either front{_within(comparison)}")
    for column in ("configuration", "front", *columns.values()):
        table.add_column(column)
    for movement in comparison.movements:
        changes = movement.change
        cells = [_change(changes, name) for name in columns]
        table.add_row(knobs_line(movement.config), "+".join(movement.on_front), *cells)
    out.print(table)
    t = comparison.tolerances
    out.print(
        f"tolerances: throughput -{t.throughput:.0%}, memory +{t.memory:.0%}, KL +{t.kl:.0%} "
        "(a level of the earlier front is met by a configuration within the memory and KL tolerances)"
    )
    if comparison.quality_apart:
        out.print(f"{comparison.quality_apart}; a level is met within the memory tolerance alone")
    for level in comparison.levels:
        out.print(_level_line(study_b, level, t))


def _within(comparison: Comparison) -> str:
    """Where the studies probed capacities: the SLO every figure of the comparison holds within."""
    target = comparison.target
    return f", at each one's capacity {target.within} (both studies)" if target else ""


def comparison_markdown(study_a: str, study_b: str, comparison: Comparison) -> str:
    t = comparison.tolerances
    verdict = "**REGRESSED**: " + ", ".join(comparison.regressed_figures()) if comparison.regressed else "no regression"
    columns = _moved_columns(comparison)
    lines = [
        f"### autotune compare: {_md(study_a)} → {_md(study_b)}: {verdict}",
        "",
        f"Tolerances: throughput -{t.throughput:.0%}, memory +{t.memory:.0%}, KL +{t.kl:.0%}.",
        *([f"Figures at each configuration's capacity {_md(comparison.target.within)}."] if comparison.target else []),
        *([f"{_md(comparison.quality_apart)}."] if comparison.quality_apart else []),
        "",
        "| configuration | front | " + " | ".join(columns.values()) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for movement in comparison.movements:
        cells = [_change(movement.change, name) for name in columns]
        lines.append(f"| `{_md(knobs_line(movement.config))}` | {'+'.join(movement.on_front)} | {' | '.join(cells)} |")
    lines += ["", "Each level of the earlier front:", ""]
    lines += [f"- {_md(_level_line(study_b, level, t))}" for level in comparison.levels]
    return "\n".join(lines)


def _md(text: str) -> str:
    """Text inside a Markdown table or list: pipes escaped, no line breaks."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def _comparison_document(study_a: str, study_b: str, comparison: Comparison) -> dict[str, Any]:
    tolerances = comparison.tolerances
    return {
        "before": study_a,
        "after": study_b,
        "threshold": comparison.threshold,
        "tolerances": asdict(tolerances),
        "slo": comparison.target.slo if comparison.target else None,
        "within": comparison.target.within if comparison.target else None,
        "quality_apart": comparison.quality_apart,
        "regressed": bool(comparison.regressed),
        "configurations": [asdict(movement) for movement in comparison.movements],
        "levels": [
            {
                **asdict(level),
                "at_capacity_before": _capacity_json(level.at_capacity_before),
                "at_capacity_after": _capacity_json(level.at_capacity_after),
                "change": level.change(),
                "regression": level.regression(),
                "regressed_figure": level.regressed_figure(tolerances),
            }
            for level in comparison.levels
        ],
    }


def _capacity_json(found: AtCapacity | None) -> dict[str, Any] | None:
    return found.to_json() if found is not None else None


def _level_line(study_b: str, level: Level, tolerances: Tolerances) -> str:
    """One level of the earlier front: what the later study gives there, in words whose signs match."""
    where = f"at {format_bytes(level.memory_gb * 1e9)} and KL {level.kl:.2e} ({knobs_line(level.config)})"
    figure = level.regressed_figure(tolerances)
    flag = f"REGRESSED {figure}" if figure else "ok"
    if level.best_after is not None:
        by = "" if level.config_after == level.config else f" with {knobs_line(level.config_after or {})}"
        return (
            f"{flag}: {where}: best throughput {level.throughput_before:.1f} -> {level.best_after:.1f} tok/s{by} "
            f"({level.change():+.1%}; a loss over {tolerances.throughput:.0%} regresses)"
            f"{_capacities(level.at_capacity_before, level.at_capacity_after)}"
        )
    miss = level.nearest_miss
    if miss is None:
        return f"{flag}: {where}: {study_b} has no complete trial"
    levels = {"memory": (miss.memory_gb, level.memory_gb, tolerances.memory), "KL": (miss.kl, level.kl, tolerances.kl)}
    bounds = "; ".join(
        f"its {name} is {share:+.1%} ({_shown(name, levels[name][0])} vs {_shown(name, levels[name][1])}, "
        f"tolerance +{levels[name][2]:.0%})"
        for name, share in miss.over.items()
    )
    speed = (miss.throughput - level.throughput_before) / level.throughput_before
    return (
        f"{flag}: {where}: no configuration of {study_b} is within its {' and '.join(miss.over)} tolerance; "
        f"the nearest, {knobs_line(miss.config)}, reaches {miss.throughput:.1f} tok/s ({speed:+.1%}) but {bounds}"
    )


def _capacities(before: AtCapacity | None, after: AtCapacity | None) -> str:
    """ "; at capacity within itl_p95<=6ms: batch 16 -> 32, 2055 -> 4100 generated tok/s end to end per GPU, ..."."""
    if before is None or after is None:
        return ""
    sizes = [before, after]
    said = " -> ".join(f.unit.size_text(f.size) if f.size is not None else "none" for f in sizes)
    per_device = " -> ".join(_per(f.tokens_per_s_per_device, "{:.4g}") for f in sizes)
    cost = " -> ".join(_per(f.cost_per_million_tokens, "${:.4g}") for f in sizes)
    return (
        f"; at capacity {after.target.within}: {said}, {per_device} generated tok/s end to end per {after.device}, "
        f"{cost} per 1M generated tokens"
    )


def _per(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def _shown(name: str, value: float) -> str:
    return format_bytes(value * 1e9) if name == "memory" else f"{value:.2e}"


def _change(changes: dict[str, float], name: str) -> str:
    return f"{changes[name]:+.1%}" if name in changes else "-"


# ------------------------------------------------------------------------------------ history


def print_history(history: History, chart: Path, output: str = "table") -> None:
    """The nights as a table (default), Markdown (a CI job's summary page) or one JSON document."""
    from autotune.report.history import history_headings, night_cells

    headings = history_headings(history)
    rows = [night_cells(history, night) for night in history.nights]
    if output == "json":
        print(json.dumps(_history_document(history, str(chart))))
    elif output == "markdown":
        regressed = ", ".join(night.label for night in history.regressed) or "none"
        count = len(history.nights)
        print(f"### autotune history: {count} night{'s' if count != 1 else ''}, regressed: {_md(regressed)}\n")
        print("| " + " | ".join(headings) + " |")
        print("|" + "---|" * len(headings))
        for cells in rows:
            print("| " + " | ".join(_md(cell) for cell in cells) + " |")
    else:
        table = Table(title="Nights side by side (each compared with the night before, as autotune compare does)")
        for column in headings:
            table.add_column(column)
        for cells in rows:
            table.add_row(*cells)
        out.print(table)
        out.print(f"chart: {chart}")


def _history_document(history: History, chart: str) -> dict[str, Any]:
    return {
        "chart": chart,
        "nights": [
            {
                "study": night.study,
                "date": night.date,
                "launched": night.launched,
                "front": [_front_point(point) for point in night.points],
                "best_throughput_tok_s": night.best_throughput,
                "lowest_peak_memory_gb": night.lowest_memory_gb,
                "lowest_kl": night.lowest_kl,
                "best_token_agreement": night.best_token_agreement,
                "best_greedy_agreement": night.best_greedy_agreement,
                "slo": night.target.slo if night.target else None,
                "fastest_at_capacity": _capacity_json(night.fastest_capacity),
                "previous": night.previous,
                "regressed": night.regressed,
                "verdict": night.verdict(),
            }
            for night in history.nights
        ],
    }


def _front_point(point: FrontPoint) -> dict[str, Any]:
    return {**asdict(point), "capacity": _capacity_json(point.capacity)}


# ------------------------------------------------------------------------------------ best


def best_document(found: Best) -> dict[str, Any]:
    chosen, deploy = found.pick, found.card
    record = chosen.chosen
    assert record is not None
    return {
        "study": found.study,
        "trial": record.number,
        "goal": str(chosen.goal),
        "constraints": [str(c) for c in chosen.constraints],
        "complete_trials": chosen.considered,
        "feasible_trials": len(chosen.feasible),
        "on_front": chosen.on_front,
        "config": record.config,
        "metrics": record.metrics,
        "speedup_vs_baseline": deploy.speedup,
        "memory_saving_vs_baseline": deploy.memory_saving,
        "capacity": _capacity_json(deploy.at_capacity),  # its capacity and what it carries there, with its SLO
        "deploy": json.loads(deploy.json),
        "python": deploy.python,
        "serve": deploy.serve,
    }


def print_best(found: Best) -> None:
    from autotune.report.cards import card_facts

    chosen, deploy = found.pick, found.card
    record = chosen.chosen
    assert record is not None
    asked = ", ".join(_asked(c, deploy) for c in chosen.constraints) or "no constraints"
    out.print(
        f"study {found.study}: trial #{record.number} ({chosen.goal}; {asked}; "
        f"{len(chosen.feasible)} of {chosen.considered} complete trials satisfy them)"
    )
    table = Table(show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("configuration", knobs_line(record.config))
    for fact in card_facts(deploy):
        table.add_row("", fact)
    table.add_row("serve", deploy.serve)
    out.print(table)
    out.print("code: add --format python (or json, serve)")


def _asked(constraint: Constraint, deploy: DeployCard) -> str:
    """A constraint for people; the study's SLO as the capacity it asks for."""
    if constraint == MEETS_SLO and deploy.at_capacity is not None:
        return f"a capacity {deploy.at_capacity.target.within}"
    return constraint.label


# ------------------------------------------------------------------------------------ gpus


def print_gpus() -> None:
    from autotune.profiles import GIB, PROFILES, detect_gpu

    table = Table(title="Hardware profiles (--gpu)")
    for column in ("profile", "device", "memory", "compute capability", "bandwidth", "price / hour"):
        table.add_column(column)
    for profile in PROFILES.values():
        table.add_row(
            profile.name,
            profile.description,
            f"{profile.memory_bytes / GIB:.0f} GiB" if profile.memory_bytes else "host RAM",
            str(profile.compute_capability or "-"),
            f"{profile.bandwidth_gb_s:.0f} GB/s",
            f"${profile.price_per_hour:.2f}" if profile.price_per_hour is not None else "-",
        )
    out.print(table)
    found = list(takewhile(lambda item: item[1] is not None, ((i, detect_gpu(i)) for i in count())))
    if not found:
        out.print("detected here: no NVIDIA GPU through NVML (auto picks cpu)")
    for index, detected in found:
        for line in detection_lines(index, detected):
            out.print(line)


def detection_lines(index: int, detected: DetectedDevice) -> list[str]:
    """What NVML said about a card, the bandwidth computed from it, and the profile auto picks, with why."""
    from autotune.profiles import DETECTED, GIB, profile_for

    bus, clock, bandwidth = detected.bus_width_bits, detected.max_memory_clock_mhz, detected.bandwidth_gb_s
    bus_text = f"{bus}-bit memory bus" if bus else "no memory bus width from NVML"
    clock_text = f"{clock} MHz max memory clock" if clock else "no max memory clock from NVML"
    computed = (
        f"{bandwidth:.0f} GB/s peak bandwidth ({bus} bits / 8 x {clock} MHz x 2 transfers per clock)"
        if bandwidth
        else "no bandwidth computed"
    )
    profile, why = profile_for(detected)
    source = "its own figures, no price" if profile.name == DETECTED else "NVML's figures, the profile's name and price"
    return [
        f"detected here, GPU {index} (NVML): {detected.name}, {detected.memory_bytes / GIB:.1f} GiB, "
        f"compute capability {detected.compute_capability}, {bus_text}, {clock_text} -> {computed}",
        f"  profile {profile.name} ({why}): {source}",
    ]
