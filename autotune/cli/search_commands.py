"""The commands that run the model: `search` (or its --dry-run), `worker` and `measure`. Each checks its flags, builds
the request they ask for, calls the library and prints what it returns."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from autotune.cli.flags import (
    FLAG,
    Artifacts,
    AsJson,
    Budget,
    Constraints,
    Device,
    Hardware,
    Model,
    Objective,
    Objectives,
    SpacePath,
    Storage,
    StoragePatienceS,
    Study,
    TrialTimeoutS,
    TrustRemoteCode,
    Workload,
    with_groups,
)
from autotune.cli.measure_printers import print_measurement
from autotune.cli.printers import (
    TrialPrinter,
    out,
    print_dry_run,
    print_finished,
    print_search_summary,
    print_worker_summary,
)
from autotune.errors import UserError
from autotune.figures.objectives import SearchGoal, search_goal
from autotune.search import interrupts
from autotune.specs import BudgetSpec, HardwareSpec, ModelSpec, SearchRequest, StorageSpec, WorkloadSpec

# `search`'s own flags
SearchStudy = Annotated[str | None, typer.Option("--study", help="Study name.", show_default="<model>-<profile>")]
SearchReport = Annotated[
    Path | None, typer.Option("--report", help="HTML report.", show_default="reports/<study>.html")
]
Seed = Annotated[int | None, typer.Option("--seed", help="Seed of the sampler.")]
Devices = Annotated[
    str | None, typer.Option("--devices", help="One worker per GPU, e.g. 0,1,2,3 (cpu for CPU workers).")
]
WarmStart = Annotated[
    str | None, typer.Option("--warm-start", help="Measure this study's Pareto configurations first.")
]
DryRunFlag = Annotated[
    bool,
    typer.Option(
        "--dry-run", help="Print the trials the search would run first, in order, with why; run nothing.", metavar=FLAG
    ),
]


@with_groups
def search(
    context: typer.Context,
    *,
    model: Model,
    hardware: Hardware,
    budget: Budget,
    space: SpacePath = None,
    study: SearchStudy = None,
    storage: Storage = None,
    report: SearchReport = None,
    workload: Workload,
    seed: Seed = None,
    constraint: Constraints = None,
    objective: Objective = None,
    objectives: Objectives = None,
    devices: Devices = None,
    warm_start: WarmStart = None,
    artifacts: Artifacts = None,
    storage_patience_s: StoragePatienceS,
    dry_run: DryRunFlag = False,
    as_json: AsJson = False,
) -> None:
    """Search configurations of MODEL and write the Pareto front to an HTML report.

    Example: autotune search --model demo --trials 8 --constraint "kl<=0.01"

    Example: autotune search --model demo --trials 8 --objective latency

    Example: autotune search --model Qwen/Qwen3-8B --gpu h100 --dry-run
    """
    goal = search_goal(objective, objectives, _given(context, "kind"), constraint or [])
    if goal.workload is not None:
        workload = replace(workload, kind=goal.workload)
    if dry_run:
        _dry_run(
            SearchRequest(model, hardware, workload, budget=budget, space_path=space, objectives=goal.objectives),
            as_json,
        )
        return
    if as_json:
        raise UserError("--json goes with --dry-run here; a search prints its trials and writes a report")
    printer = TrialPrinter(out)  # progress from the first second: the imports below take a while
    printer.progress("loading autotune's libraries (optuna, sqlalchemy)")
    places = StorageSpec(study, storage, artifacts, patience_s=storage_patience_s)
    request = _search_request(model, hardware, workload, budget, goal, places, space, seed, devices, warm_start)
    _run_search(request, report, artifacts, printer)


def _search_request(
    model: ModelSpec,
    hardware: HardwareSpec,
    workload: WorkloadSpec,
    budget: BudgetSpec,
    goal: SearchGoal,
    places: StorageSpec,
    space: Path | None,
    seed: int | None,
    devices: str | None,
    warm_start: str | None,
) -> SearchRequest:
    """What `search`'s flags ask for, once they hold together."""
    from autotune.figures.constraints import parse_constraints

    if budget.budget_s is None and budget.max_trials is None:
        raise UserError("give a budget (--budget 30m) or a number of trials (--trials 20), or both")
    return SearchRequest(
        model,
        hardware,
        workload,
        budget=budget,
        storage=places,
        space_path=space,
        seed=seed,
        constraints=tuple(parse_constraints(goal.constraints)),
        objectives=goal.objectives,
        devices=tuple(device.strip() for device in devices.split(",")) if devices else (),
        warm_start=warm_start,
    )


def _run_search(request: SearchRequest, report: Path | None, artifacts: str | None, printer: TrialPrinter) -> None:
    """The search, its summary, then its front and report; exit 1 when a worker failed."""
    from autotune.analysis.capacity import held_at
    from autotune.search.finish import finish
    from autotune.search.run import run_search
    from autotune.validate import check_search_inputs

    check_search_inputs(request, report)
    interrupts.install()
    summary = run_search(request, printer)
    held = held_at(request.workload)
    print_search_summary(summary, held.within, quality_at_capacity=held.quality_too)
    print_finished(finish(summary, report, artifacts))
    if summary.failed_workers:
        print(f"autotune: {'; '.join(summary.failed_workers)} (its lines above say why)", file=sys.stderr)
        raise typer.Exit(1)


def _dry_run(request: SearchRequest, as_json: bool) -> None:
    """`search --dry-run`: the planned first trials; no study, no model run, no GPU needed."""
    from autotune.search.dry_run import dry_run

    run = dry_run(request)
    print_dry_run(run, as_json)
    if not as_json:
        for note in run.notes:
            out.print(f"note: {note}")


def _given(context: typer.Context, parameter: str) -> bool:
    """Whether the user wrote the flag (not its default, not an environment variable)."""
    source = context.get_parameter_source(parameter)
    return source is not None and source.name == "COMMANDLINE"


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
    from autotune.specs import WorkerRequest
    from autotune.validate import check_device

    check_device(device)
    interrupts.install()
    if PARENT_PID_VARIABLE in os.environ:  # started by `search --devices`: end with it
        die_with_parent()
    places = StorageSpec(study, storage, artifacts, patience_s=storage_patience_s)
    summary = join_study(WorkerRequest(places, device, budget, trust_remote_code, run_id), TrialPrinter(out))
    print_worker_summary(summary)


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
    from autotune.validate import check_measure_inputs

    request = SearchRequest(
        model, hardware, workload, budget=BudgetSpec(trial_timeout_s=trial_timeout_s), space_path=space
    )
    check_measure_inputs(request)
    config, result = measure_configuration(request, parse_settings(settings or []))
    print_measurement(model, workload, config, result, as_json)
    if not result.ok:
        raise typer.Exit(1)
