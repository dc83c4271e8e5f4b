"""The commands that run the model: `search` (or its --dry-run), `worker`, `evaluate` and `measure`. Each checks its
flags, builds the request they ask for, calls the library and prints what it returns."""

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
    TrialTimeoutS,
    TrustRemoteCode,
    Workload,
    with_groups,
)
from autotune.cli.measure_printers import print_ceiling_failure, print_ceilings, print_measurement
from autotune.cli.printers import (
    TrialPrinter,
    out,
    print_dry_run,
    print_evaluated,
    print_finished,
    print_search_summary,
    print_worker_summary,
)
from autotune.errors import UserError
from autotune.figures.constraints import Constraint
from autotune.figures.objectives import SearchGoal, search_goal
from autotune.search import interrupts
from autotune.specs import (
    BudgetSpec,
    EvalSpec,
    HardwareSpec,
    ModelSpec,
    SearchRequest,
    StorageSpec,
    WorkerRequest,
    WorkloadSpec,
)
from autotune.workloads.base import MIN_SECONDS

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
    request = replace(request, evaluation=_evaluation(evaluate, eval_limit))
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


def _evaluation(task: str | None, limit: int | None) -> EvalSpec | None:
    """--eval: refused in one line where lm-evaluation-harness is not installed."""
    from autotune.extras import EVAL, why_missing

    if task is None:
        if limit is not None:
            raise UserError("--eval-limit goes with --eval TASK")
        return None
    if not task.strip():
        raise UserError(
            "--eval must name a task: demo, a task of lm-evaluation-harness, or a folder of task YAML files"
        )
    if missing := why_missing("--eval", EVAL):
        raise UserError(missing)
    return EvalSpec(task.strip(), limit)


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


# `evaluate`'s own flags
EvalTrials = Annotated[
    list[int] | None, typer.Option("--trial", min=0, help="Evaluate this trial (its number); repeat for more.")
]
PickMaximize = Annotated[
    str | None, typer.Option("--maximize", help="As best: evaluate its pick for this goal (throughput by default).")
]
PickMinimize = Annotated[str | None, typer.Option("--minimize", help="As best: its pick for this goal.")]
EvalTask = Annotated[
    str | None,
    typer.Option(
        "--eval",
        help="The task, for a study searched without --eval (its reference is evaluated first): demo, a task of "
        "lm-evaluation-harness, or a folder of task YAML files.",
        show_default="the study's",
    ),
]
EvalBudget = Annotated[
    str | None,
    typer.Option("--budget", help="Wall-clock budget: 90s, 30m, 2h; an evaluation starts only if its forecast fits."),
]


@with_groups
def evaluate(
    *,
    study: Study,
    storage_url: Storage = None,
    trials: EvalTrials = None,
    constraint: Constraints = None,
    maximize: PickMaximize = None,
    minimize: PickMinimize = None,
    task: EvalTask = None,
    eval_limit: EvalLimit = None,
    device: Device = None,
    budget: EvalBudget = None,
    trial_timeout_s: TrialTimeoutS,
    trust_remote_code: TrustRemoteCode = False,
    artifacts: Artifacts = None,
    storage_patience_s: StoragePatienceS,
) -> None:
    """Evaluate configurations of a stored study on its task (tier 1), as a search evaluates its front's finalists.

    Which: --trial N; or, with --constraint, --maximize or --minimize, the configuration `autotune best` picks.

    Where constraints bound the task's own figures (flips, recovery), the next in best's order until one meets them.

    With neither, the front's finalists not evaluated yet.

    Stored as a search's finalists are: best, compare, history and the report read them.

    Example: autotune evaluate --study demo-cpu --trial 5

    Example: autotune evaluate --study demo-cpu --constraint "memory<=40MB" --constraint "flips<=0.05"
    """
    from autotune.analysis.pick import goal_from_flags
    from autotune.figures.constraints import parse_constraints
    from autotune.search.evaluate import EvaluateRequest, evaluate_stored
    from autotune.study import default_storage_url
    from autotune.validate import check_device

    if trials and (constraint or maximize or minimize):
        raise UserError("give --trial, or best's --constraint / --maximize / --minimize, not both")
    evaluation = _evaluation(task, eval_limit) if task is not None else None
    if task is None:
        if eval_limit is not None:
            raise UserError("--eval-limit goes with --eval TASK (a study searched with --eval keeps its own)")
        from autotune.extras import EVAL, why_missing

        if missing := why_missing("autotune evaluate", EVAL):
            raise UserError(missing)
    check_device(device)
    places = StorageSpec(study, storage_url or default_storage_url(study), artifacts, patience_s=storage_patience_s)
    worker = WorkerRequest(places, device, BudgetSpec(_duration(budget), None, trial_timeout_s), trust_remote_code)
    request = EvaluateRequest(
        worker, tuple(trials or ()), tuple(parse_constraints(constraint or [])), goal_from_flags(maximize, minimize),
        evaluation,
    )  # fmt: skip
    printer = TrialPrinter(out)
    interrupts.install()
    evaluated = evaluate_stored(request, printer)
    print_evaluated(evaluated)
    if evaluated.failed:
        numbers = ", ".join(f"#{number}" for number in evaluated.failed)
        print(f"autotune: the evaluation of {numbers} failed (its line above says why)", file=sys.stderr)
        raise typer.Exit(1)


def _duration(text: str | None) -> float | None:
    from autotune.units import parse_duration

    return parse_duration(text) if text else None


@with_groups
def measure(
    *,
    model: Model,
    overrides: Annotated[
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
    from autotune.measure.configuration import measure as measure_configuration
    from autotune.measure.configuration import parse_overrides
    from autotune.validate import check_measure_inputs

    request = SearchRequest(
        model, hardware, workload, budget=BudgetSpec(trial_timeout_s=trial_timeout_s), space_path=space
    )
    check_measure_inputs(request)
    config, result = measure_configuration(request, parse_overrides(overrides or []))
    print_measurement(model, workload, config, result, as_json)
    if not result.ok:
        raise typer.Exit(1)


# The flags of `autotune ceiling`, its own: the hand loop's model, device, shape and timing.
_CeilingModel = Annotated[str, typer.Option("--model", help="demo, a model folder or a hub id.")]
_CeilingDevice = Annotated[str, typer.Option("--device", help="cpu, cuda or cuda:N.")]
_CeilingGpu = Annotated[
    str | None,
    typer.Option("--gpu", help="Hardware profile for the roofline's peak.", show_default="cpu on a CPU, else auto"),
]
_Dtype = Annotated[str, typer.Option("--dtype", help="torch dtype of the weights.")]
_CompileMode = Annotated[
    str | None,
    typer.Option(
        "--compile",
        help="torch.compile mode of the decode step, or off.",
        show_default="reduce-overhead on CUDA, default on a CPU",
    ),
]
_BatchSizes = Annotated[
    list[int] | None, typer.Option("--batch-size", help="Prompts per batch; repeat for more.", show_default="8")
]
_Warmup = Annotated[int, typer.Option("--warmup", help="Untimed calls first (the first compiles).")]
_MinIterations = Annotated[int, typer.Option("--min-iterations", help="Timed calls at least.")]
_MinSeconds = Annotated[float, typer.Option(MIN_SECONDS.name, help="Seconds of timed calls at least.")]
_CeilingStudy = Annotated[str | None, typer.Option("--study", help="Also store the figures with this study.")]
_CeilingStorage = Annotated[str | None, typer.Option("--storage", help="The study's storage URL (with --study).")]


def ceiling(
    model: _CeilingModel = "demo",
    device: _CeilingDevice = "cpu",
    gpu: _CeilingGpu = None,
    dtype: _Dtype = "bfloat16",
    compile_mode: _CompileMode = None,
    batch_sizes: _BatchSizes = None,
    input_len: Annotated[int, typer.Option("--input-len", help="Tokens per prompt.")] = 128,
    output_len: Annotated[int, typer.Option("--output-len", help="Tokens generated per prompt.")] = 64,
    warmup: _Warmup = 2,
    min_iterations: _MinIterations = 5,
    min_seconds: _MinSeconds = 3.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of lines.", metavar=FLAG)] = False,
    study: _CeilingStudy = None,
    storage_url: _CeilingStorage = None,
) -> None:
    """Measure the decode ceiling: a hand-written greedy loop on MODEL, a static cache and one compiled decode step.

    Nothing runs between tokens, as gpt-fast decodes. Its decode throughput and roofline share compare with a trial's.

    With --study, the figures are stored with that study (of this model and device), and its report shows them.

    Example: autotune ceiling --model demo --batch-size 1 --batch-size 8 --study demo-cpu --storage sqlite:///s.db
    """
    from autotune.measure.ceiling import CeilingRequest, measure_ceilings
    from autotune.process.ceiling import CeilingSpec

    if output_len < 2:
        raise UserError("--output-len must be at least 2: decode throughput needs two tokens")
    if study and not storage_url:
        raise UserError("--study needs --storage")
    cuda = device.startswith("cuda")
    compile_mode = compile_mode or ("reduce-overhead" if cuda else "default")
    shape = (tuple(batch_sizes or [8]), input_len, output_len)
    hand_loop = CeilingSpec(dtype, compile_mode, *shape, warmup, min_iterations, min_seconds)
    profile = gpu or ("auto" if cuda else "cpu")
    run = measure_ceilings(CeilingRequest(model, device, profile, hand_loop, study, storage_url))
    if run.failure is not None:
        print_ceiling_failure(run.failure)
        raise typer.Exit(1)
    print_ceilings(run.figures, as_json)
