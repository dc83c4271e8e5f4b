"""Command line: thin commands over the library. Bad input ends as one line on stderr and exit status 2."""

from __future__ import annotations

import json
import logging
import os
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from autotune import interrupts
from autotune.data import load_prompts
from autotune.errors import NothingSatisfiesError, SearchError, UserError
from autotune.metrics import KL_DIVERGENCE, THROUGHPUT
from autotune.progress import ProgressDisplay
from autotune.results import QualitySpec, WorkloadSpec
from autotune.space import Config
from autotune.space.knobs import short_name
from autotune.units import format_bytes, format_duration, parse_duration

if TYPE_CHECKING:
    from autotune.compare import Comparison
    from autotune.study import TrialRecord

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Search transformers inference configurations for the fastest, leanest one that keeps quality.",
)
out = Console(highlight=False, markup=False, soft_wrap=True)
if not out.is_terminal:  # piped or logged: do not squeeze tables into 80 columns
    out.width = 200

Study = Annotated[str, typer.Option("--study", help="Study name.")]
Storage = Annotated[
    str | None,
    typer.Option("--storage", help="Optuna storage URL.", show_default="sqlite:///studies/<study>.db"),
]
Constraints = Annotated[
    list[str] | None,
    typer.Option(
        "--constraint",
        help='A bound on a figure, repeatable: "peak_memory_gb<=20", "memory<=20GB", "kl<=0.01", '
        '"throughput>=500", "ttft_ms<=50", "top1>=99%".',
    ),
]


def _knobs(config: Config) -> str:
    return " ".join(f"{short_name(name)}={value}" for name, value in config.items())


class TrialPrinter:
    """One line per finished trial; what runs now, with elapsed time (autotune.progress)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.display = ProgressDisplay(console)

    def note(self, message: str) -> None:
        self.console.print(f"note: {message}")

    def progress(self, what: str) -> None:
        self.display.show(what)

    def trial_started(self, number: int, config: Config, roles: list[str]) -> None:
        self.display.show(f"trial #{number}: {_knobs(config)}")

    def trial_finished(self, record: TrialRecord) -> None:
        self.display.clear()
        roles = ",".join(record.roles)
        label = f"#{record.number}" + (f" [{roles}]" if roles else "")
        self.console.print(f"{label} {_knobs(record.config)} -> {_figures(record)} ({_duration(record)})")


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


@app.callback()
def _root(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what the library does.")] = False):
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


Model = Annotated[str, typer.Option("--model", help="Hub id, local folder, or 'demo' (built-in, offline).")]
Gpu = Annotated[str, typer.Option("--gpu", help="Hardware profile (see `autotune gpus`), or auto.")]
Device = Annotated[str | None, typer.Option("--device", help="cuda, cuda:N or cpu.", show_default="from --gpu")]
SpacePath = Annotated[
    Path | None, typer.Option("--space", help="Search-space YAML.", show_default="search_spaces/default.yaml")
]
Revision = Annotated[str | None, typer.Option("--revision", help="Model revision on the hub.")]
TrustRemoteCode = Annotated[bool, typer.Option("--trust-remote-code", help="Allow the model's own code to run.")]
WorkloadKind = Annotated[
    str,
    typer.Option(
        "--workload",
        help="throughput (a batch of prompts), latency (one prompt at a time), serve (transformers serve under load).",
    ),
]
Load = Annotated[
    str | None,
    typer.Option(
        "--load", help="serve: rate=2,4,8 (Poisson arrivals/s) or concurrency=1,8,32; concurrency=1,4 if not given."
    ),
]
Slo = Annotated[str | None, typer.Option("--slo", help='serve: latency objectives, "ttft_p95<=300ms,itl_p95<=50ms".')]
ServePort = Annotated[
    int | None,
    typer.Option("--serve-port", min=1, max=65535, help="serve: port of the server; a free one if not given."),
]
BatchSize = Annotated[int, typer.Option("--batch-size", min=1, help="Prompts per generation (throughput).")]
InputLen = Annotated[int, typer.Option("--input-len", min=1, help="Tokens per prompt.")]
OutputLen = Annotated[int, typer.Option("--output-len", min=2, help="Tokens generated per prompt.")]
Prompts = Annotated[
    Path | None, typer.Option("--prompts", help="Your prompts: .jsonl ({'prompt': ...}) or text, one per line.")
]
Price = Annotated[
    float | None, typer.Option("--price", min=0, help="GPU price per hour.", show_default="the profile's")
]
TrialTimeout = Annotated[str, typer.Option("--trial-timeout", help="Kill a trial after this long.")]
Artifacts = Annotated[
    str | None,
    typer.Option(
        "--artifacts",
        help="Where trial logs and reports are stored as Optuna artifacts: a folder, s3://BUCKET or gs://BUCKET.",
        show_default="<study>.artifacts beside the SQLite file",
    ),
]


def _workload(
    kind: str,
    batch_size: int,
    input_len: int,
    output_len: int,
    prompts: Path | None,
    serving: tuple[str | None, str | None, int | None] = (None, None, None),
) -> WorkloadSpec:
    from autotune.serving.options import workload_serve_spec

    if kind not in ("throughput", "latency", "serve"):
        raise UserError(f"--workload {kind!r} is not a workload: use throughput, latency or serve")
    if prompts is not None:
        load_prompts(prompts)  # bad prompts are bad input, before anything runs
    path = str(prompts.resolve()) if prompts else None
    serve = workload_serve_spec(kind, *serving)
    return WorkloadSpec(kind, batch_size, input_len, output_len, prompts_path=path, serve=serve)  # type: ignore[arg-type]


@app.command()
def search(
    model: Model,
    gpu: Gpu = "auto",
    budget: Annotated[str | None, typer.Option("--budget", help="Wall-clock budget: 90s, 30m, 2h.")] = None,
    trials: Annotated[int | None, typer.Option("--trials", min=1, help="Run at most N trials.")] = None,
    space: SpacePath = None,
    study: Annotated[str | None, typer.Option("--study", help="Study name.", show_default="<model>-<profile>")] = None,
    storage: Storage = None,
    device: Device = None,
    report: Annotated[
        Path | None, typer.Option("--report", help="HTML report.", show_default="reports/<study>.html")
    ] = None,
    revision: Revision = None,
    trust_remote_code: TrustRemoteCode = False,
    workload: WorkloadKind = "throughput",
    batch_size: BatchSize = 8,
    input_len: InputLen = 128,
    output_len: OutputLen = 64,
    prompts: Prompts = None,
    load: Load = None,
    slo: Slo = None,
    serve_port: ServePort = None,
    price: Price = None,
    trial_timeout: TrialTimeout = "20m",
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of the sampler.")] = None,
    constraint: Constraints = None,
    devices: Annotated[
        str | None, typer.Option("--devices", help="One worker per GPU, e.g. 0,1,2,3 (cpu for CPU workers).")
    ] = None,
    warm_start: Annotated[
        str | None, typer.Option("--warm-start", help="Measure this study's Pareto configurations first.")
    ] = None,
    artifacts: Artifacts = None,
) -> None:
    """Search configurations of MODEL and write the Pareto front to an HTML report.

    Example: autotune search --model demo --trials 8 --constraint "kl<=0.01"
    """
    printer = TrialPrinter(out)  # progress from the first second: the imports below take a while
    printer.progress("loading autotune's libraries (optuna, sqlalchemy)")
    from autotune.artifacts import attach_report
    from autotune.constraints import parse_constraints
    from autotune.report import build_report, default_report_path
    from autotune.search import SearchOptions, run_search
    from autotune.validate import check_search_inputs

    if budget is None and trials is None:
        raise UserError("give a budget (--budget 30m) or a number of trials (--trials 20), or both")
    constraints = parse_constraints(constraint or [])
    options = SearchOptions(
        model=model,
        gpu=gpu,
        device=device,
        budget_s=parse_duration(budget) if budget else None,
        max_trials=trials,
        space_path=space,
        study_name=study,
        storage=storage,
        revision=revision,
        trust_remote_code=trust_remote_code,
        workload=_workload(workload, batch_size, input_len, output_len, prompts, (load, slo, serve_port)),
        quality=QualitySpec(),
        trial_timeout_s=parse_duration(trial_timeout, "--trial-timeout"),
        seed=seed,
        price_per_hour=price,
        constraints=constraints,
        devices=[device.strip() for device in devices.split(",")] if devices else None,
        warm_start=warm_start,
        artifacts=artifacts,
    )
    check_search_inputs(options, report)
    interrupts.install()
    summary = run_search(options, printer)
    out.print(
        f"study {summary.study_name}: {summary.launched} trials in {format_duration(summary.elapsed_s)} "
        f"({summary.stop_reason})"
    )
    spent = ", ".join(
        f"{name} {format_duration(seconds)}" for name, seconds in summary.spent_s.items() if seconds >= 0.05
    )
    out.print(f"time spent: {spent}")
    _print_front(summary.study_name, summary.storage)
    path = build_report(summary.study_name, summary.storage, report or default_report_path(summary.study_name))
    out.print(f"report: {path}")
    stored_in = attach_report(summary.study_name, summary.storage, artifacts, path)
    if stored_in:
        out.print(f"trial logs and the report are stored as Optuna artifacts in {stored_in}")


@app.command()
def worker(
    study: Study,
    storage: Annotated[str, typer.Option("--storage", help="The study's storage URL (shared by every worker).")],
    device: Device = None,
    trials: Annotated[int | None, typer.Option("--trials", min=1, help="Run at most N trials.")] = None,
    budget: Annotated[str | None, typer.Option("--budget", help="Wall-clock budget: 90s, 30m, 2h.")] = None,
    trust_remote_code: TrustRemoteCode = False,
    trial_timeout: TrialTimeout = "20m",
    run_id: Annotated[str | None, typer.Option("--run-id", hidden=True)] = None,
    artifacts: Artifacts = None,
) -> None:
    """Join an existing study as one more worker, on this machine's GPU (or CPU).

    The study's model, space, workload and reference come from storage; reference outputs are computed once per machine.

    Example: autotune worker --study qwen-h100 --storage postgresql://tuner@db/studies --device cuda:1
    """
    from autotune.runner import PARENT_PID_VARIABLE
    from autotune.search import SearchOptions, join_study
    from autotune.validate import check_device

    check_device(device)
    interrupts.install()
    if PARENT_PID_VARIABLE in os.environ:  # started by `search --devices`: end with it
        from autotune.worker.__main__ import die_with_parent

        die_with_parent()
    options = SearchOptions(
        model="",
        device=device,
        budget_s=parse_duration(budget) if budget else None,
        max_trials=trials,
        study_name=study,
        storage=storage,
        trust_remote_code=trust_remote_code,
        trial_timeout_s=parse_duration(trial_timeout, "--trial-timeout"),
        run_id=run_id,
        artifacts=artifacts,
    )
    summary = join_study(options, TrialPrinter(out))
    out.print(
        f"worker on study {summary.study_name}: {summary.launched} trials in "
        f"{format_duration(summary.elapsed_s)} ({summary.stop_reason})"
    )


@app.command()
def compare(
    study_a: Annotated[str, typer.Argument(metavar="STUDY_A", help="The earlier study (e.g. last night's).")],
    study_b: Annotated[str, typer.Argument(metavar="STUDY_B", help="The later study.")],
    storage: Storage = None,
    storage_b: Annotated[
        str | None, typer.Option("--storage-b", help="Storage of STUDY_B.", show_default="--storage")
    ] = None,
    threshold: Annotated[
        str | None,
        typer.Option(
            "--threshold", help="Throughput loss that is a regression: 5%, 0.05.", show_default="GPU 5%, CPU 25%"
        ),
    ] = None,
    memory_tolerance: Annotated[
        str | None,
        typer.Option(
            "--memory-tolerance", help="Extra peak memory that still meets a level.", show_default="GPU 5%, CPU 15%"
        ),
    ] = None,
    kl_tolerance: Annotated[
        str | None, typer.Option("--kl-tolerance", help="Extra KL that still meets a level.", show_default="10%")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compare two studies: how each front configuration's figures moved; exit 3 on a regression.

    A regression: at a point of STUDY_A's front, STUDY_B's best throughput at that memory and KL is lower.

    Each figure has its own tolerance, by the device of STUDY_A, above that figure's run-to-run noise there.
    """
    from autotune import study as studies
    from autotune.compare import DEFAULT_TOLERANCES, Tolerances
    from autotune.compare import compare as compare_studies

    url_a = storage or studies.default_storage(study_a)
    url_b = storage_b or storage or studies.default_storage(study_b)
    a, b = studies.load_stored_study(url_a, study_a), studies.load_stored_study(url_b, study_b)
    defaults = DEFAULT_TOLERANCES[studies.stored_settings(a).profile.get("kind", "cuda")]
    tolerances = Tolerances(
        throughput=_fraction(threshold, "--threshold") if threshold else defaults.throughput,
        memory=_fraction(memory_tolerance, "--memory-tolerance") if memory_tolerance else defaults.memory,
        kl=_fraction(kl_tolerance, "--kl-tolerance") if kl_tolerance else defaults.kl,
    )
    comparison = compare_studies(
        studies.records(a), studies.pareto_numbers(a), studies.records(b), studies.pareto_numbers(b), tolerances
    )
    if as_json:
        print(json.dumps(_comparison_document(study_a, study_b, comparison)))
    else:
        _print_comparison(study_a, study_b, comparison)
    if comparison.regressed:
        raise typer.Exit(3)


def _fraction(text: str, flag: str) -> float:
    try:
        value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise UserError(f"{flag} {text!r} is not a share: write it like 5% or 0.05") from None
    if not 0 <= value < 1:
        raise UserError(f"{flag} {text!r} must be between 0% and 100%")
    return value


def _comparison_document(study_a: str, study_b: str, comparison: Comparison) -> dict:
    from dataclasses import asdict

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


def _print_comparison(study_a: str, study_b: str, comparison: Comparison) -> None:
    table = Table(title=f"{study_a} -> {study_b}: figures of the configurations on either front")
    for column in ("configuration", "front", "tok/s", "ttft", "memory", "KL"):
        table.add_column(column)
    for movement in comparison.movements:
        changes = movement.change
        cells = [_change(changes, name) for name in ("throughput_tok_s", "ttft_s", "peak_memory_gb", "kl_divergence")]
        table.add_row(_knobs(movement.config), "+".join(movement.on_front), *cells)
    out.print(table)
    t = comparison.tolerances
    out.print(
        f"tolerances: throughput -{t.throughput:.0%}, memory +{t.memory:.0%}, KL +{t.kl:.0%} "
        "(a level of the earlier front is met by a configuration within the memory and KL tolerances)"
    )
    for level in comparison.levels:
        out.print(_level_line(study_b, level, t))


def _level_line(study_b: str, level, tolerances) -> str:
    """One level of the earlier front: what the later study gives there, in words whose signs match."""
    where = f"at {format_bytes(level.memory_gb * 1e9)} and KL {level.kl:.2e} ({_knobs(level.config)})"
    figure = level.regressed_figure(tolerances)
    flag = f"REGRESSED {figure}" if figure else "ok"
    if level.best_after is not None:
        by = "" if level.config_after == level.config else f" with {_knobs(level.config_after or {})}"
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
        f"the nearest, {_knobs(miss.config)}, reaches {miss.throughput:.1f} tok/s ({speed:+.1%}) but {bounds}"
    )


def _shown(name: str, value: float) -> str:
    return format_bytes(value * 1e9) if name == "memory" else f"{value:.2e}"


def _change(changes: dict[str, float], name: str) -> str:
    return f"{changes[name]:+.1%}" if name in changes else "-"


@app.command()
def measure(
    model: Model,
    settings: Annotated[
        list[str] | None, typer.Option("--set", help="knob=value; unset knobs keep the transformers defaults.")
    ] = None,
    gpu: Gpu = "auto",
    device: Device = None,
    space: SpacePath = None,
    revision: Revision = None,
    trust_remote_code: TrustRemoteCode = False,
    workload: WorkloadKind = "throughput",
    batch_size: BatchSize = 8,
    input_len: InputLen = 128,
    output_len: OutputLen = 64,
    prompts: Prompts = None,
    load: Load = None,
    slo: Slo = None,
    serve_port: ServePort = None,
    price: Price = None,
    trial_timeout: TrialTimeout = "20m",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Measure one configuration of MODEL, with no study, in the trial worker the search uses.

    Example: autotune measure --model demo --set dtype=bfloat16 --set attn_implementation=sdpa --json
    """
    from autotune.measure import measure as measure_configuration
    from autotune.measure import parse_settings
    from autotune.search import SearchOptions
    from autotune.validate import check_measure_inputs

    options = SearchOptions(
        model=model,
        gpu=gpu,
        device=device,
        space_path=space,
        revision=revision,
        trust_remote_code=trust_remote_code,
        workload=_workload(workload, batch_size, input_len, output_len, prompts, (load, slo, serve_port)),
        trial_timeout_s=parse_duration(trial_timeout, "--trial-timeout"),
        price_per_hour=price,
    )
    check_measure_inputs(options)
    config, result = measure_configuration(options, parse_settings(settings or []))
    document = {
        "model": model,
        "config": config,
        "workload": options.workload.to_json(),
        "outcome": result.outcome.value,
        "message": result.message,
        "metrics": result.metrics,
        "stats": result.stats,
        "timings": result.timings,
        "environment": result.environment,
        "serve": result.details.get("serve"),  # serve workload: the command that ran, figures per load level
    }
    if as_json:
        print(json.dumps(document))
    else:
        _print_measurement(document)
    if not result.ok:
        raise typer.Exit(1)


def _print_measurement(document: dict) -> None:
    out.print(f"{_knobs(document['config'])} -> {document['outcome']} {document['message']}".rstrip())
    table = Table(title="figures (p50, p95, coefficient of variation, repeats)")
    for column in ("figure", "p50", "p95", "cv", "n"):
        table.add_column(column)
    for name, summary in document["stats"].items():
        table.add_row(name, f"{summary['p50']:.6g}", f"{summary['p95']:.6g}", f"{summary['cv']:.2%}", str(summary["n"]))
    out.print(table)
    for name in sorted(document["metrics"]):
        if name not in document["stats"]:
            out.print(f"{name}: {document['metrics'][name]:.6g}")


def _print_front(study_name: str, storage_url: str) -> None:
    from autotune import study as studies
    from autotune.report.data import collect

    data = collect(studies.load_stored_study(storage_url, study_name), storage_url)
    table = Table(title=f"Pareto front of {study_name}")
    for column in ("#", "configuration", "tok/s", "vs baseline", "ttft", "memory", "KL", "top-1"):
        table.add_column(column)
    for card in data.cards:
        m = card.record.metrics
        table.add_row(
            str(card.record.number),
            _knobs(card.record.config),
            f"{m[THROUGHPUT.name]:.1f}",
            f"{card.speedup:.2f}x" if card.speedup else "-",
            f"{m['ttft_s'] * 1000:.1f} ms",
            format_bytes(m["peak_memory_bytes"]),
            f"{m[KL_DIVERGENCE.name]:.2e}",
            f"{m['top1_agreement'] * 100:.1f}%",
        )
    out.print(table)


@app.command()
def report(
    study: Study,
    storage: Storage = None,
    out_path: Annotated[
        Path | None, typer.Option("--out", help="HTML file.", show_default="reports/<study>.html")
    ] = None,
) -> None:
    """Render the HTML report of a stored study again."""
    from autotune.report import build_report, default_report_path
    from autotune.study import default_storage

    path = build_report(study, storage or default_storage(study), out_path or default_report_path(study))
    out.print(f"report: {path}")


class Format(str, Enum):
    table = "table"
    json = "json"
    python = "python"
    serve = "serve"


@app.command()
def best(
    study: Study,
    storage: Storage = None,
    max_memory: Annotated[
        str | None, typer.Option("--max-memory", help="Peak memory at most this: 20GB, 512MB (GB if bare).")
    ] = None,
    max_kl: Annotated[float | None, typer.Option("--max-kl", help="KL divergence vs the reference at most.")] = None,
    min_throughput: Annotated[
        float | None, typer.Option("--min-throughput", help="Decode throughput at least (tok/s).")
    ] = None,
    constraint: Constraints = None,
    maximize: Annotated[
        str | None, typer.Option("--maximize", help="What to maximize: throughput (default), top1, ...")
    ] = None,
    minimize: Annotated[
        str | None, typer.Option("--minimize", help="What to minimize: memory, kl, ttft, cost...")
    ] = None,
    output: Annotated[Format, typer.Option("--format", help="table, json, python or serve.")] = Format.table,
) -> None:
    """Pick one configuration of a study under constraints and print it.

    The study's own --constraint flags from `autotune search` apply too.

    Exit status 3 when no complete trial satisfies them, so a nightly job can act on it.

    Example: autotune best --study demo-cpu --max-memory 20GB --max-kl 0.01 --format json
    """
    from autotune import study as studies
    from autotune.constraints import parse_constraint, parse_constraints
    from autotune.pick import goal_from_flags, pick
    from autotune.report.data import card

    shortcuts = [
        parse_constraint(f"{name}{op}{value}", f"{flag} {str(value)!r}")
        for flag, name, op, value in (
            ("--max-memory", "memory", "<=", max_memory),
            ("--max-kl", "kl", "<=", max_kl),
            ("--min-throughput", "throughput", ">=", min_throughput),
        )
        if value is not None
    ]
    asked = parse_constraints([*map(str, shortcuts), *(constraint or [])])
    goal = goal_from_flags(maximize, minimize)
    url = storage or studies.default_storage(study)
    stored = studies.load_stored_study(url, study)
    settings = studies.stored_settings(stored)
    records = studies.records(stored)
    chosen = pick(records, parse_constraints([*settings.constraints, *map(str, asked)]), goal)
    if chosen.chosen is None:
        raise NothingSatisfiesError(chosen.why_none())
    baseline = next((r for r in records if "baseline" in r.roles and r.complete), None)
    deploy = card(chosen.chosen, settings, baseline)
    if output == Format.python:
        typer.echo(deploy.python, nl=False)
    elif output == Format.serve:
        typer.echo(deploy.serve)
    elif output == Format.json:
        typer.echo(json.dumps(_best_document(study, chosen, deploy), indent=2))
    else:
        _print_best(study, chosen, deploy)


def _best_document(study_name: str, chosen, deploy) -> dict:
    record = chosen.chosen
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


def _print_best(study_name: str, chosen, deploy) -> None:
    from autotune.report.html import card_facts

    record = chosen.chosen
    asked = ", ".join(c.label for c in chosen.constraints) or "no constraints"
    out.print(
        f"study {study_name}: trial #{record.number} ({chosen.goal}; {asked}; "
        f"{len(chosen.feasible)} of {chosen.considered} complete trials satisfy them)"
    )
    table = Table(show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("configuration", _knobs(record.config))
    for fact in card_facts(deploy):
        table.add_row("", fact)
    table.add_row("serve", deploy.serve)
    out.print(table)
    out.print("code: add --format python (or json, serve)")


@app.command()
def gpus() -> None:
    """List the hardware profiles and the GPU detected here."""
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


def main() -> None:
    """Entry point: run the app; known errors become one line without a traceback."""
    try:
        code = app(standalone_mode=False)
    except (UserError, typer.TyperException) as error:  # TyperException: click's usage errors
        message = error.format_message() if isinstance(error, typer.TyperException) else str(error)
        if message:  # empty after no_args_is_help printed the help
            print(f"autotune: error: {message}", file=sys.stderr)
        sys.exit(2)
    except SearchError as error:
        print(f"autotune: search stopped: {error}", file=sys.stderr)
        sys.exit(1)
    except NothingSatisfiesError as error:
        print(f"autotune: nothing satisfies the constraints: {error}", file=sys.stderr)
        sys.exit(NothingSatisfiesError.EXIT_STATUS)
    except interrupts.Interrupted as interrupt:
        print(f"autotune: {interrupts.summary(interrupt)}", file=sys.stderr)
        sys.exit(interrupt.exit_status)
    except (KeyboardInterrupt, typer.Abort):
        print("autotune: interrupted; the study keeps every finished trial", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
