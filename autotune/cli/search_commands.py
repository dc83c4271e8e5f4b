"""The commands that run a search: `search` (or its --dry-run), `worker` (one more worker of a study), and the hidden
`join` (a worker `search --devices` starts). Each checks its flags, builds the request they ask for, calls the library
and prints what it returns."""

from __future__ import annotations

import json
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
    Eval,
    EvalLimit,
    Hardware,
    Model,
    Objective,
    Objectives,
    SpacePath,
    Storage,
    StoragePatienceS,
    Study,
    TrustRemoteCode,
    evaluation_spec,
    with_groups,
)
from autotune.cli.printers import (
    TrialPrinter,
    out,
    print_dry_run,
    print_finished,
    print_search_summary,
    print_worker_summary,
)
from autotune.cli.workload_flags import Workload
from autotune.errors import UserError
from autotune.figures.constraints import Constraint
from autotune.figures.objectives import SearchGoal, search_goal
from autotune.search import interrupts
from autotune.specs import BudgetSpec, HardwareSpec, ModelSpec, SearchRequest, StorageSpec, WorkerRequest, WorkloadSpec

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
WorkerTraffic = Annotated[
    Path | None,
    typer.Option(
        "--traffic",
        help="The trace the study replays, where this machine cannot fetch it from the study's artifacts.",
        show_default="the study's copy",
    ),
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
    storage_url: Storage = None,
    report: SearchReport = None,
    workload: Workload,
    seed: Seed = None,
    constraint: Constraints = None,
    objective: Objective = None,
    objectives: Objectives = None,
    devices: Devices = None,
    warm_start: WarmStart = None,
    evaluate: Eval = None,
    eval_limit: EvalLimit = None,
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
    if workload.traffic is not None:
        goal = goal.on_a_trace()
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
    places = StorageSpec(study, storage_url, artifacts, patience_s=storage_patience_s)
    request = _search_request(model, hardware, workload, budget, goal, places, space, seed, devices, warm_start)
    request = replace(request, evaluation=evaluation_spec(evaluate, eval_limit))
    _run_search(request, report, artifacts, printer)


def _refuse_bounds_after_the_search(constraints: tuple[Constraint, ...]) -> None:
    """A figure tier 1 measures after the search (flips, accuracy) cannot bound its trials: refused in one line."""
    from autotune.figures.metrics import after_search

    later = {metric.name for metric in after_search()}
    for constraint in constraints:
        if constraint.metric in later:
            raise UserError(
                f"--constraint {constraint}: {constraint.metric} is measured after the search, on the front's "
                "finalists (--eval), so it cannot bound its trials; apply it afterwards with "
                f'autotune best --constraint "{constraint}"'
            )


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
    constraints = tuple(parse_constraints(goal.constraints))
    _refuse_bounds_after_the_search(constraints)
    return SearchRequest(
        model,
        hardware,
        workload,
        budget=budget,
        storage=places,
        space_path=space,
        seed=seed,
        constraints=constraints,
        preset_guard=goal.preset_guard,
        objectives=goal.objectives,
        devices=tuple(device.strip() for device in devices.split(",")) if devices else (),
        warm_start=warm_start,
    )


def _run_search(request: SearchRequest, report: Path | None, artifacts: str | None, printer: TrialPrinter) -> None:
    """The search, its summary, then its front and report; exit 1 when a worker failed."""
    from autotune.analysis.capacity import held_at
    from autotune.search.finish import finish
    from autotune.search.run import run_search
    from autotune.search.session import storage_waiting
    from autotune.validate import check_search_inputs

    check_search_inputs(request, report)
    interrupts.install()
    summary = run_search(request, printer)
    held = held_at(request.workload)
    print_search_summary(summary, held.within, quality_at_capacity=held.quality_too)
    print_finished(finish(summary, report, artifacts, storage_waiting(request.storage.patience_s, printer)))
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
    storage_url: Annotated[str, typer.Option("--storage", help="The study's storage URL (shared by every worker).")],
    device: Device = None,
    budget: Budget,
    trust_remote_code: TrustRemoteCode = False,
    artifacts: Artifacts = None,
    traffic: WorkerTraffic = None,
    storage_patience_s: StoragePatienceS,
) -> None:
    """Join an existing study as one more worker, on this machine's GPU (or CPU).

    The study's model, space, workload and reference come from storage; reference outputs are computed once per machine.

    Example: autotune worker --study qwen-h100 --storage postgresql://tuner@db/studies --device cuda:1
    """
    places = StorageSpec(study, storage_url, artifacts, patience_s=storage_patience_s)
    _join(WorkerRequest(places, device, budget, trust_remote_code, traffic=str(traffic.resolve()) if traffic else None))


def join(
    request_file: Annotated[
        Path, typer.Argument(metavar="REQUEST", help="The worker's request as JSON (WorkerRequest.to_json).")
    ],
) -> None:
    """Join a study as `autotune worker` does, from the request `search --devices` wrote for this worker."""
    _join(WorkerRequest.from_json(json.loads(request_file.read_text())))


def _join(request: WorkerRequest) -> None:
    from autotune.process.life import PARENT_PID_VARIABLE, die_with_parent
    from autotune.search.run import join_study
    from autotune.validate import check_device

    check_device(request.device)
    interrupts.install()
    if PARENT_PID_VARIABLE in os.environ:  # started by `search --devices`: end with it
        die_with_parent()
    print_worker_summary(join_study(request, TrialPrinter(out)))
