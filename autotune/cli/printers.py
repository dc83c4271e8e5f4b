"""What the commands print: progress lines, tables and JSON documents. Nothing here decides anything."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from autotune.cli.progress import ProgressDisplay
from autotune.figures.metrics import KL_DIVERGENCE, OBJECTIVES, PEAK_MEMORY, THROUGHPUT, Metric
from autotune.space import Config
from autotune.space.knobs import short_name
from autotune.units import format_bytes, format_duration

if TYPE_CHECKING:
    from autotune.analysis.compare import Comparison, Level, Tolerances
    from autotune.analysis.pick import Pick
    from autotune.report.data import ParetoCard
    from autotune.search.finish import Finished
    from autotune.search.options import SearchSummary
    from autotune.study import TrialRecord

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


def _figures(record: TrialRecord) -> str:
    if not record.complete:
        first_line = (record.message or "").splitlines()[0] if record.message else ""
        return f"{record.outcome}: {first_line[:160]}"
    m = record.metrics
    return (
        f"ok {m[THROUGHPUT.name]:.1f} tok/s, ttft {m['ttft_s'] * 1000:.1f} ms, "
        f"{format_bytes(m['peak_memory_bytes'])}, KL {m[KL_DIVERGENCE.name]:.2e}, "
        f"top-1 {m['top1_agreement'] * 100:.1f}%"
    ) + _serve_figures(m)


def _serve_figures(m: dict[str, float]) -> str:
    if "goodput_req_s" not in m:
        return ""
    return f", {m['requests_per_s']:.2f} req/s, goodput {m['goodput_req_s']:.2f} req/s, {m['errors']:.0f} failed"


def _duration(record: TrialRecord) -> str:
    return format_duration(record.duration_s) if record.duration_s is not None else "-"


# ------------------------------------------------------------------------------------ search, worker


def print_search_summary(summary: SearchSummary) -> None:
    out.print(
        f"study {summary.study_name}: {summary.launched} trials in {format_duration(summary.elapsed_s)} "
        f"({summary.stop_reason})"
    )
    spent = ", ".join(
        f"{name} {format_duration(seconds)}" for name, seconds in summary.spent_s.items() if seconds >= 0.05
    )
    out.print(f"time spent: {spent}")


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


SHOWN_IN_FRONT = {THROUGHPUT.name, "ttft_s", PEAK_MEMORY.name, KL_DIVERGENCE.name, "top1_agreement"}


def print_front(
    study_name: str, cards: list[ParetoCard], objectives: Sequence[Metric] = OBJECTIVES, baseline: Config | None = None
) -> None:
    """The front's figures, each configuration as its changes from the baseline, and a column for each of the
    study's objectives the usual ones leave out."""
    extra = [metric for metric in objectives if metric.name not in SHOWN_IN_FRONT]
    title = f"Pareto front of {study_name}" + (f" (baseline: {knobs_line(baseline)})" if baseline else "")
    table = Table(title=title)
    changes = "changes from the baseline" if baseline else "configuration"
    for column in ("#", changes, "tok/s", "vs baseline", "ttft", "memory", "KL", "top-1"):
        table.add_column(column)
    for metric in extra:
        table.add_column(metric.heading)
    for card in cards:
        m = card.record.metrics
        table.add_row(
            str(card.record.number),
            changes_line(card.record.config, baseline) if baseline else knobs_line(card.record.config),
            f"{m[THROUGHPUT.name]:.1f}",
            f"{card.speedup:.2f}x" if card.speedup else "-",
            f"{m['ttft_s'] * 1000:.1f} ms",
            format_bytes(m["peak_memory_bytes"]),
            f"{m[KL_DIVERGENCE.name]:.2e}",
            f"{m['top1_agreement'] * 100:.1f}%",
            *(_figure(metric, m.get(metric.name)) for metric in extra),
        )
    out.print(table)


def _figure(metric: Metric, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.2f} ms" if metric.unit == "s" else f"{value:.4g} {metric.unit}".rstrip()


# ------------------------------------------------------------------------------------ measure


def print_measurement(document: dict[str, Any], as_json: bool) -> None:
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


# ------------------------------------------------------------------------------------ compare


def print_comparison(study_a: str, study_b: str, comparison: Comparison, as_json: bool) -> None:
    if as_json:
        print(json.dumps(_comparison_document(study_a, study_b, comparison)))
        return
    table = Table(title=f"{study_a} -> {study_b}: figures of the configurations on either front")
    for column in ("configuration", "front", "tok/s", "ttft", "memory", "KL"):
        table.add_column(column)
    for movement in comparison.movements:
        changes = movement.change
        cells = [_change(changes, name) for name in ("throughput_tok_s", "ttft_s", "peak_memory_gb", "kl_divergence")]
        table.add_row(knobs_line(movement.config), "+".join(movement.on_front), *cells)
    out.print(table)
    t = comparison.tolerances
    out.print(
        f"tolerances: throughput -{t.throughput:.0%}, memory +{t.memory:.0%}, KL +{t.kl:.0%} "
        "(a level of the earlier front is met by a configuration within the memory and KL tolerances)"
    )
    for level in comparison.levels:
        out.print(_level_line(study_b, level, t))


def _comparison_document(study_a: str, study_b: str, comparison: Comparison) -> dict[str, Any]:
    tolerances = comparison.tolerances
    return {
        "before": study_a,
        "after": study_b,
        "threshold": comparison.threshold,
        "tolerances": asdict(tolerances),
        "regressed": bool(comparison.regressed),
        "configurations": [asdict(movement) for movement in comparison.movements],
        "levels": [
            {
                **asdict(level),
                "change": level.change(),
                "regression": level.regression(),
                "regressed_figure": level.regressed_figure(tolerances),
            }
            for level in comparison.levels
        ],
    }


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


def _shown(name: str, value: float) -> str:
    return format_bytes(value * 1e9) if name == "memory" else f"{value:.2e}"


def _change(changes: dict[str, float], name: str) -> str:
    return f"{changes[name]:+.1%}" if name in changes else "-"


# ------------------------------------------------------------------------------------ best


def best_document(study_name: str, chosen: Pick, deploy: ParetoCard) -> dict[str, Any]:
    record = chosen.chosen
    assert record is not None
    return {
        "study": study_name,
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
        "deploy": json.loads(deploy.json),
        "python": deploy.python,
        "serve": deploy.serve,
    }


def print_best(study_name: str, chosen: Pick, deploy: ParetoCard) -> None:
    from autotune.report.html import card_facts

    record = chosen.chosen
    assert record is not None
    asked = ", ".join(c.label for c in chosen.constraints) or "no constraints"
    out.print(
        f"study {study_name}: trial #{record.number} ({chosen.goal}; {asked}; "
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
    detected = detect_gpu()
    if detected is None:
        out.print("detected here: no CUDA GPU (auto picks cpu)")
    else:
        match = detected.matching_profile() or "none (auto builds one from the device)"
        out.print(f"detected here: {detected.name}, {detected.memory_bytes / GIB:.0f} GiB; profile {match}")
