"""What the commands print: progress lines, tables and JSON documents. Nothing here decides anything."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from autotune.cli.progress import ProgressDisplay
from autotune.figures.metrics import (
    ERRORS,
    FRONT,
    GOODPUT,
    OBJECTIVES,
    OUTPUT_TOK_S,
    PEAK_MEMORY,
    PEAK_MEMORY_BYTES,
    REQUESTS,
    REQUESTS_PER_S,
    SLO_SHARE,
    THROUGHPUT,
    Metric,
    shown_in,
)
from autotune.figures.quality import ON_THE_PATH, path_lines, path_note
from autotune.figures.slo import describe_slo, in_ms
from autotune.process.phases import COMPILING
from autotune.process.results import COLD, WARM
from autotune.space import Config
from autotune.space.knobs import short_name
from autotune.units import first_line, format_bytes, format_duration

if TYPE_CHECKING:
    from autotune.analysis.capacity import AtCapacity
    from autotune.analysis.found import BestFound
    from autotune.figures.capacity import Capacity, Point
    from autotune.profiles import DetectedDevice, HardwareProfile
    from autotune.report.data import ParetoCard
    from autotune.search.dry_run import DryRun
    from autotune.search.evaluate import Evaluated
    from autotune.search.events import SearchSummary
    from autotune.search.finish import Finished
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


def in_markdown(text: str) -> str:
    """Text inside a Markdown table or list: pipes escaped, no line breaks."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def capacity_json(found: AtCapacity | None) -> dict[str, Any] | None:
    """A capacity and what a configuration carries there, with its SLO, as a JSON document holds it."""
    return found.to_json() if found is not None else None


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


MESSAGE_CHARS = 300  # of a failed trial's message, on its line: its first line, which says what failed and why


def _figures(record: TrialRecord) -> str:
    if not record.complete:
        return f"{record.outcome}: {first_line(record.message or '', MESSAGE_CHARS)}"
    m = record.metrics
    return f"ok {figures_line(m)}" + _serve_figures(m) + _path_note(record.quality_path)


def figures_line(m: dict[str, float]) -> str:
    """The front's figures a trial measured, as its line says them: "1219.2 tok/s, ttft 44.1 ms, 30.06 MB, KL ..."."""
    return ", ".join(metric.line_text(m) for metric in shown_in(FRONT) if metric.measured(m))


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
    """The trial's duration, and its compile time where it compiled, cold or warm."""
    duration = format_duration(record.duration_s) if record.duration_s is not None else "-"
    compiled = record.compiled
    if compiled is None or not compiled.compiled:
        return duration
    return f"{duration}, compiling {format_duration(compiled.seconds)} {compiled.cache}"


# ------------------------------------------------------------------------------------ search, worker


def print_search_summary(summary: SearchSummary, capacity_within: str = "", quality_at_capacity: bool = True) -> None:
    """`capacity_within`: "within itl_p95<=6ms" where the trials' figures are at their capacity within an SLO;
    `quality_at_capacity`: the quality figures too (decoded at that batch), not a serve trial's (one prompt)."""
    out.print(
        f"study {summary.study_name}: {summary.launched} trials in {format_duration(summary.elapsed_s)} "
        f"({summary.stop_reason})"
    )
    spent = ", ".join(
        f"{name} {format_duration(seconds)}{_compiles(summary) if name == COMPILING else ''}"
        for name, seconds in summary.spent_s.items()
        if seconds >= 0.05
    )
    out.print(f"time spent: {spent}")
    for found in summary.best:
        at_capacity = quality_at_capacity or found.metric.name not in ON_THE_PATH
        at = f" at its capacity {capacity_within}" if capacity_within and at_capacity else ""
        out.print(f"best {found.metric.label}: {_best_figure(found)}{at}, {_found_when(found)}")
    if summary.passed_over:
        listed = "; ".join(summary.passed_over)
        out.print(f"not started, the budget left could not finish them: {listed}")
    for line in summary.evaluation:
        out.print(line)


def _compiles(summary: SearchSummary) -> str:
    """How many trials compiled cold (a graph anew) and warm (every graph from the study's compile cache)."""
    counts = [f"{summary.compiles[cache]} {cache}" for cache in (COLD, WARM) if summary.compiles.get(cache)]
    return f" ({', '.join(counts)})" if counts else ""


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
    """A worker's trials, then its evaluations on the study's task (tier 1), where the study has one."""
    out.print(
        f"worker on study {summary.study_name}: {summary.launched} trials in "
        f"{format_duration(summary.elapsed_s)} ({summary.stop_reason})"
    )
    for line in summary.evaluation:
        out.print(line)


def print_evaluated(evaluated: Evaluated) -> None:
    """`autotune evaluate`: what it was asked for and its time, as a search's summary says it; then its lines."""
    out.print(f"study {evaluated.study_name}: {evaluated.chosen}, in {format_duration(evaluated.elapsed_s)}")
    spent = ", ".join(
        f"{name} {format_duration(seconds)}" for name, seconds in evaluated.spent_s.items() if seconds >= 0.05
    )
    if spent:  # none where nothing was left to evaluate
        out.print(f"time spent: {spent}")
    for line in evaluated.lines:
        out.print(line)


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


def print_front(
    study_name: str, cards: list[ParetoCard], objectives: Sequence[Metric] = OBJECTIVES, baseline: Config | None = None
) -> None:
    """The front's figures, each configuration as its changes from the baseline, and a column for each of the
    study's objectives the usual ones leave out."""
    figures = shown_in(FRONT, [card.record.metrics for card in cards])
    extra = [metric for metric in objectives if metric not in shown_in(FRONT)]
    title = f"Pareto front of {study_name}" + (f" (baseline: {knobs_line(baseline)})" if baseline else "")
    probed = next((card.at_capacity for card in cards if card.at_capacity is not None), None)
    if probed is not None:
        title += f", each at its capacity {probed.target.within}"
        missed = cards[0].baseline_capacity
        if missed is not None and missed.size is None:
            title += f"; the baseline meets it at no {missed.unit.name}: vs baseline compares with its figures past it"
    table = Table(title=title)
    changes = "changes from the baseline" if baseline else "configuration"
    headings = [metric.column_heading for metric in figures]
    headings.insert(figures.index(THROUGHPUT) + 1, "vs baseline")  # the speedup, beside the throughput it is of
    for column in ("#", changes, *(["capacity"] if probed else []), *headings, *(m.heading for m in extra)):
        table.add_column(column)
    for card in cards:
        m = card.record.metrics
        found = card.at_capacity
        cells = [metric.text(m) for metric in figures]
        cells.insert(figures.index(THROUGHPUT) + 1, f"{card.speedup:.2f}x" if card.speedup else "-")
        table.add_row(
            str(card.record.number),
            changes_line(card.record.config, baseline) if baseline else knobs_line(card.record.config),
            *([found.unit.size_text(found.size) if found and found.size is not None else "-"] if probed else []),
            *cells,
            *(_figure(metric, m.get(metric.name)) for metric in extra),
        )
    out.print(table)
    for line in path_lines((card.record.number, card.record.quality_path) for card in cards):
        out.print(line)


def _figure(metric: Metric, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.2f} ms" if metric.unit == "s" else f"{value:.4g} {metric.unit}".rstrip()


# ------------------------------------------------------------------------------------ gpus


def print_gpus(profiles: Iterable[HardwareProfile], found: list[tuple[int, DetectedDevice]]) -> None:
    """The hardware profiles, then each GPU detected here and the profile auto picks for it."""
    from autotune.profiles import GIB

    table = Table(title="Hardware profiles (--gpu)")
    for column in ("profile", "device", "memory", "compute capability", "bandwidth", "price / hour"):
        table.add_column(column)
    for profile in profiles:
        table.add_row(
            profile.name,
            profile.description,
            f"{profile.memory_bytes / GIB:.0f} GiB" if profile.memory_bytes else "host RAM",
            str(profile.compute_capability or "-"),
            f"{profile.bandwidth_gb_s:.0f} GB/s",
            f"${profile.price_per_hour:.2f}" if profile.price_per_hour is not None else "-",
        )
    out.print(table)
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
