"""Command line: thin commands over the library. Bad input ends as one line on stderr and exit status 2."""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from autotune.cli.flags import (
    FLAG,
    Artifacts,
    AsJson,
    Budget,
    Constraints,
    Device,
    FormatJson,
    Hardware,
    Model,
    Objective,
    Objectives,
    OldReportFlag,
    SpacePath,
    Storage,
    StoragePatienceS,
    Study,
    ToleranceFlags,
    TrialTimeoutS,
    TrustRemoteCode,
    Workload,
    report_path,
    with_groups,
)
from autotune.cli.printers import (
    TrialPrinter,
    out,
    print_dry_run,
    print_finished,
    print_gpus,
    print_measurement,
    print_search_summary,
    print_worker_summary,
)
from autotune.cli.study_printers import best_document, print_best, print_comparison, print_history
from autotune.errors import NothingSatisfiesError, OutputError, SearchError, StorageUnavailableError, UserError
from autotune.figures.objectives import search_goal
from autotune.search import interrupts
from autotune.specs import BudgetSpec, HardwareSpec, ModelSpec, WorkloadSpec

if TYPE_CHECKING:
    from autotune.figures.constraints import Constraint

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Search transformers inference configurations for the fastest, leanest one that keeps quality.",
)


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what the library does.", metavar=FLAG)] = False,
):
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


@app.command()
@with_groups
def search(
    context: typer.Context,
    *,
    model: Model,
    hardware: Hardware,
    budget: Budget,
    space: SpacePath = None,
    study: Annotated[str | None, typer.Option("--study", help="Study name.", show_default="<model>-<profile>")] = None,
    storage: Storage = None,
    report: Annotated[
        Path | None, typer.Option("--report", help="HTML report.", show_default="reports/<study>.html")
    ] = None,
    workload: Workload,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of the sampler.")] = None,
    constraint: Constraints = None,
    objective: Objective = None,
    objectives: Objectives = None,
    devices: Annotated[
        str | None, typer.Option("--devices", help="One worker per GPU, e.g. 0,1,2,3 (cpu for CPU workers).")
    ] = None,
    warm_start: Annotated[
        str | None, typer.Option("--warm-start", help="Measure this study's Pareto configurations first.")
    ] = None,
    artifacts: Artifacts = None,
    storage_patience_s: StoragePatienceS,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the trials the search would run first, in order, with why; run nothing.",
            metavar=FLAG,
        ),
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Search configurations of MODEL and write the Pareto front to an HTML report.

    Example: autotune search --model demo --trials 8 --constraint "kl<=0.01"

    Example: autotune search --model demo --trials 8 --objective latency

    Example: autotune search --model Qwen/Qwen3-8B --gpu h100 --dry-run
    """
    workload_given = _given(context, "kind")
    goal = search_goal(objective, objectives, workload_given, constraint or [])
    if goal.workload is not None:
        workload = replace(workload, kind=goal.workload)
    if dry_run:
        _dry_run(model, hardware, workload, budget, space, goal.objectives, as_json)
        return
    if as_json:
        raise UserError("--json goes with --dry-run here; a search prints its trials and writes a report")
    printer = TrialPrinter(out)  # progress from the first second: the imports below take a while
    printer.progress("loading autotune's libraries (optuna, sqlalchemy)")
    from autotune.analysis.capacity import held_at
    from autotune.figures.constraints import parse_constraints
    from autotune.search.finish import finish
    from autotune.search.run import run_search
    from autotune.specs import SearchRequest, StorageSpec
    from autotune.validate import check_search_inputs

    if budget.budget_s is None and budget.max_trials is None:
        raise UserError("give a budget (--budget 30m) or a number of trials (--trials 20), or both")
    request = SearchRequest(
        model,
        hardware,
        workload,
        budget=budget,
        storage=StorageSpec(study, storage, artifacts, patience_s=storage_patience_s),
        space_path=space,
        seed=seed,
        constraints=tuple(parse_constraints(goal.constraints)),
        objectives=goal.objectives,
        devices=tuple(device.strip() for device in devices.split(",")) if devices else (),
        warm_start=warm_start,
    )
    check_search_inputs(request, report)
    interrupts.install()
    summary = run_search(request, printer)
    held = held_at(request.workload)
    print_search_summary(summary, held.within, quality_at_capacity=held.quality_too)
    print_finished(finish(summary, report, artifacts))
    if summary.failed_workers:
        print(f"autotune: {'; '.join(summary.failed_workers)} (its lines above say why)", file=sys.stderr)
        raise typer.Exit(1)


def _dry_run(
    model: ModelSpec,
    hardware: HardwareSpec,
    workload: WorkloadSpec,
    budget: BudgetSpec,
    space: Path | None,
    objectives: tuple[str, ...],
    as_json: bool,
) -> None:
    """`search --dry-run`: the planned first trials; no study, no model run, no GPU needed."""
    from autotune.search.dry_run import dry_run
    from autotune.specs import SearchRequest

    request = SearchRequest(model, hardware, workload, budget=budget, space_path=space, objectives=objectives)
    run = dry_run(request)
    print_dry_run(run, as_json)
    if not as_json:
        for note in run.notes:
            out.print(f"note: {note}")


@app.command()
@with_groups
def worker(
    *,
    study: Study,
    storage: Annotated[str, typer.Option("--storage", help="The study's storage URL (shared by every worker).")],
    device: Device = None,
    budget: Budget,
    trust_remote_code: TrustRemoteCode = False,
    run_id: Annotated[str | None, typer.Option("--run-id", hidden=True)] = None,
    artifacts: Artifacts = None,
    storage_patience_s: StoragePatienceS,
) -> None:
    """Join an existing study as one more worker, on this machine's GPU (or CPU).

    The study's model, space, workload and reference come from storage; reference outputs are computed once per machine.

    Example: autotune worker --study qwen-h100 --storage postgresql://tuner@db/studies --device cuda:1
    """
    from autotune.process.life import PARENT_PID_VARIABLE, die_with_parent
    from autotune.search.run import join_study
    from autotune.specs import StorageSpec, WorkerRequest
    from autotune.validate import check_device

    check_device(device)
    interrupts.install()
    if PARENT_PID_VARIABLE in os.environ:  # started by `search --devices`: end with it
        die_with_parent()
    places = StorageSpec(study, storage, artifacts, patience_s=storage_patience_s)
    summary = join_study(WorkerRequest(places, device, budget, trust_remote_code, run_id), TrialPrinter(out))
    print_worker_summary(summary)


class CompareFormat(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"


@app.command()
@with_groups
def compare(
    *,
    study_a: Annotated[str, typer.Argument(metavar="STUDY_A", help="The earlier study (e.g. last night's).")],
    study_b: Annotated[str, typer.Argument(metavar="STUDY_B", help="The later study.")],
    storage: Storage = None,
    storage_b: Annotated[
        str | None, typer.Option("--storage-b", help="Storage of STUDY_B.", show_default="--storage")
    ] = None,
    tolerances: ToleranceFlags,
    output: Annotated[
        CompareFormat, typer.Option("--format", help="table, json, or markdown (a CI job summary).")
    ] = CompareFormat.table,
    as_json: FormatJson = False,
) -> None:
    """Compare two studies: how each front configuration's figures moved; exit 3 on a regression.

    A regression: at a point of STUDY_A's front, STUDY_B's best throughput at that memory and KL is lower.

    Studies searched with an SLO compare their figures at capacity, and only under the same SLO.

    Each figure has its own tolerance, by the device of STUDY_A, above that figure's run-to-run noise there.

    Example: autotune compare night-1 night-2 --format markdown >> "$GITHUB_STEP_SUMMARY"
    """
    from autotune.analysis.compare import compare_studies
    from autotune.study import default_storage
    from autotune.study.opened import OpenedStudy

    url_a = storage or default_storage(study_a)
    url_b = storage_b or storage or default_storage(study_b)
    comparison = compare_studies(OpenedStudy.open(study_a, url_a), OpenedStudy.open(study_b, url_b), tolerances)
    print_comparison(study_a, study_b, comparison, "json" if as_json else output.value)
    if comparison.regressed:
        raise typer.Exit(3)


class HistoryFormat(str, Enum):
    table = "table"
    markdown = "markdown"
    json = "json"


@app.command()
@with_groups
def history(
    *,
    studies_named: Annotated[
        str, typer.Option("--studies", help="Comma-separated study names or glob patterns: 'demo-cpu-2026-11-*'.")
    ],
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage", help="Storage of every study.", show_default="each study's sqlite:///studies/<study>.db"
        ),
    ] = None,
    report_file: Annotated[
        Path | None, typer.Option("--report", help="The chart (HTML).", show_default="reports/history.html")
    ] = None,
    old_report_flag: OldReportFlag = None,
    tolerances: ToleranceFlags,
    output: Annotated[
        HistoryFormat, typer.Option("--format", help="What to print: table, markdown (a CI job summary) or json.")
    ] = HistoryFormat.table,
    as_json: FormatJson = False,
    artifacts: Annotated[
        str | None,
        typer.Option("--artifacts", help="Also store the chart with the last night's study: a folder, s3://, gs://."),
    ] = None,
) -> None:
    """Nights side by side: each study's front (best throughput, memory, KL), regressions marked, as a chart.

    The studies are ordered by the date in their names (YYYY-MM-DD).

    Each night is compared with the one before as `autotune compare` does, with the same tolerances.

    Example: autotune history --studies 'demo-cpu-2026-11-*' --report reports/nights.html
    """
    from autotune.report import build_history

    names = [name.strip() for name in studies_named.split(",") if name.strip()]
    if not names:
        raise UserError("--studies: name at least one study or pattern, e.g. 'demo-cpu-2026-11-*'")
    out_path = report_path(report_file, old_report_flag) or Path("reports/history.html")
    nights, path = build_history(names, storage, out_path, tolerances, artifacts)
    print_history(nights, path, "json" if as_json else output.value)


def _given(context: typer.Context, parameter: str) -> bool:
    """Whether the user wrote the flag (not its default, not an environment variable)."""
    source = context.get_parameter_source(parameter)
    return source is not None and source.name == "COMMANDLINE"


@app.command()
@with_groups
def measure(
    *,
    model: Model,
    settings: Annotated[
        list[str] | None, typer.Option("--set", help="knob=value; unset knobs keep the transformers defaults.")
    ] = None,
    hardware: Hardware,
    space: SpacePath = None,
    workload: Workload,
    trial_timeout_s: TrialTimeoutS,
    as_json: AsJson = False,
) -> None:
    """Measure one configuration of MODEL, with no study, in the trial worker the search uses.

    Example: autotune measure --model demo --set dtype=bfloat16 --set attn_implementation=sdpa --json
    """
    from autotune.search.measure import measure as measure_configuration
    from autotune.search.measure import parse_settings
    from autotune.space.knobs import WorkloadKnob
    from autotune.specs import BudgetSpec, SearchRequest
    from autotune.validate import check_measure_inputs
    from autotune.workloads import workload_as_run
    from autotune.workloads.capacity import Capacity

    budget = BudgetSpec(trial_timeout_s=trial_timeout_s)
    request = SearchRequest(model, hardware, workload, budget=budget, space_path=space)
    check_measure_inputs(request)
    config, result = measure_configuration(request, parse_settings(settings or []))
    capacity = Capacity.from_json(result.details.capacity) if result.details.capacity else None
    document = {
        "model": model.id,
        "config": config,
        "workload": workload_as_run(
            {**workload.to_json(), "kind": config.get(WorkloadKnob.name, workload.kind)}
        ),  # ran
        "outcome": result.outcome.value,
        "message": result.message,
        "metrics": result.metrics,
        "stats": result.stats,
        "timings": result.timings,
        "environment": result.environment,
        "serve": result.details.serve,  # serve workload: the command that ran, figures per load level
        "capacity": capacity.shown() if capacity else None,  # an SLO or a capacity probe: its points, what it found
        "quality_path": result.details.quality_path,  # where its quality figures came from (figures/quality.py)
    }
    print_measurement(document, as_json, capacity)
    if not result.ok:
        raise typer.Exit(1)


@app.command()
def report(
    study: Study,
    storage: Storage = None,
    report_file: Annotated[
        Path | None, typer.Option("--report", help="HTML report.", show_default="reports/<study>.html")
    ] = None,
    old_report_flag: OldReportFlag = None,
) -> None:
    """Render the HTML report of a stored study again."""
    from autotune.report import build_report, default_report_path
    from autotune.study import default_storage

    out_path = report_path(report_file, old_report_flag) or default_report_path(study)
    path = build_report(study, storage or default_storage(study), out_path)
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
    as_json: FormatJson = False,
) -> None:
    """Pick one configuration of a study under constraints and print it.

    The study's own --constraint flags from `autotune search` apply too.

    Exit status 3 when no complete trial satisfies them, so a nightly job can act on it.

    Example: autotune best --study demo-cpu --max-memory 20GB --max-kl 0.01 --format json
    """
    from autotune.analysis.pick import goal_from_flags
    from autotune.report.best import best as pick_best
    from autotune.study import default_storage

    asked = _asked_constraints(max_memory, max_kl, min_throughput, constraint or [])
    goal = goal_from_flags(maximize, minimize)
    found = pick_best(study, storage or default_storage(study), asked, goal)
    if as_json:
        output = Format.json
    if output == Format.python:
        typer.echo(found.card.python, nl=False)
    elif output == Format.serve:
        typer.echo(found.card.serve)
    elif output == Format.json:
        typer.echo(json.dumps(best_document(found), indent=2))
    else:
        print_best(found)


def _asked_constraints(
    max_memory: str | None, max_kl: float | None, min_throughput: float | None, constraints: list[str]
) -> list[Constraint]:
    """`best`'s shortcut flags as constraints, then its --constraint flags."""
    from autotune.figures.constraints import parse_constraint, parse_constraints

    shortcuts = [
        parse_constraint(f"{name}{op}{value}", f"{flag} {str(value)!r}")
        for flag, name, op, value in (
            ("--max-memory", "memory", "<=", max_memory),
            ("--max-kl", "kl", "<=", max_kl),
            ("--min-throughput", "throughput", ">=", min_throughput),
        )
        if value is not None
    ]
    return parse_constraints([*map(str, shortcuts), *constraints])


@app.command()
def gpus() -> None:
    """List the hardware profiles and the GPU detected here."""
    print_gpus()


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
    except OutputError as error:
        print(f"autotune: {error}", file=sys.stderr)
        sys.exit(1)
    except StorageUnavailableError as error:
        print(f"autotune: storage unavailable: {error}", file=sys.stderr)
        sys.exit(interrupts.pending_exit_status() or StorageUnavailableError.EXIT_STATUS)
    except interrupts.Interrupted as interrupt:
        print(f"autotune: {interrupts.summary(interrupt)}", file=sys.stderr)
        sys.exit(interrupt.exit_status)
    except (KeyboardInterrupt, typer.Abort):
        print("autotune: interrupted; the study keeps every finished trial", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
