"""`evaluate`: configurations of a stored study evaluated on its task (tier 1), as a search evaluates its front's
finalists. It checks its flags, builds the request, calls the library and prints what it returns."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from autotune.cli.flags import (
    Artifacts,
    Constraints,
    Device,
    EvalLimit,
    Storage,
    StoragePatienceS,
    Study,
    TrialTimeoutS,
    TrustRemoteCode,
    evaluation_spec,
    with_groups,
)
from autotune.cli.printers import TrialPrinter, out, print_evaluated
from autotune.errors import UserError
from autotune.search import interrupts
from autotune.specs import BudgetSpec, StorageSpec, WorkerRequest

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
    evaluation = evaluation_spec(task, eval_limit) if task is not None else None
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
