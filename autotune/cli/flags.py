"""The flags the commands share, each written once: typed `Annotated` aliases, and groups of them.

A group is a function whose parameters are flags and whose result is one spec, built and checked
once. A command names the spec in its signature (`workload: Workload`) and `with_groups` puts the
group's flags in its place, so `search`, `measure` and `worker` share them instead of repeating them.
The workload's group and its flags are workload_flags.py's; those of a request trace, traffic_flags.py's.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args, get_origin

import typer

from autotune.analysis.tolerances import DEFAULT_TOLERANCES, GivenTolerances
from autotune.errors import UserError
from autotune.specs import (
    DEFAULT_STORAGE_PATIENCE,
    DEFAULT_TRIAL_TIMEOUT,
    BudgetSpec,
    EvalSpec,
    HardwareSpec,
    ModelSpec,
)
from autotune.units import parse_duration

Command = TypeVar("Command", bound=Callable[..., Any])


@dataclass(frozen=True)
class Group:
    """Marks a command parameter as filled by `build` from the flags of `build`'s own signature."""

    build: Callable[..., Any]


def with_groups(command: Command) -> Command:
    """`command` with each of its group parameters replaced by the group's flags (keyword-only, in place)."""
    signature = inspect.signature(command, eval_str=True)
    groups: dict[str, Callable[..., Any]] = {}
    flags: list[inspect.Parameter] = []
    for parameter in signature.parameters.values():
        group = _group_of(parameter.annotation)
        if group is None:
            flags.append(parameter)
            continue
        groups[parameter.name] = group.build
        flags.extend(inspect.signature(group.build, eval_str=True).parameters.values())
    flags = [flag.replace(kind=inspect.Parameter.KEYWORD_ONLY) for flag in flags]

    @functools.wraps(command)
    def run(**given: Any) -> Any:
        for name, build in groups.items():
            own = inspect.signature(build).parameters
            given[name] = build(**{flag: given.pop(flag) for flag in own})
        return command(**given)

    run.__signature__ = signature.replace(parameters=flags)  # type: ignore[attr-defined]  # what Typer reads
    run.__annotations__ = {flag.name: flag.annotation for flag in flags}
    return run  # type: ignore[return-value]


def _group_of(annotation: Any) -> Group | None:
    if get_origin(annotation) is not Annotated:
        return None
    return next((extra for extra in get_args(annotation)[1:] if isinstance(extra, Group)), None)


# ------------------------------------------------------------------------------------ single flags

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
Eval = Annotated[
    str | None,
    typer.Option(
        "--eval",
        help="After the search, evaluate the reference and each configuration on the front on this task through "
        "lm-evaluation-harness (pip install 'autotune[eval]'): demo (built in, offline), a task name, or a folder of "
        "task YAML files. Its accuracy, recovery and answer flips are figures of the study.",
    ),
]
EvalLimit = Annotated[
    int | None,
    typer.Option("--eval-limit", min=1, help="Evaluate this many items of the --eval task.", show_default="all"),
]
Objective = Annotated[
    str | None,
    typer.Option(
        "--objective",
        help="A preset of objectives, workload and constraints: latency, throughput, balanced, memory.",
        show_default="balanced",
    ),
]
Objectives = Annotated[
    str | None,
    typer.Option(
        "--objectives",
        help='The objectives, in order, replacing the preset\'s: "goodput,memory,kl", "tpot,ttft,energy".',
        show_default="the preset's",
    ),
]
FLAG = ""  # the metavar of an on/off flag: help would show `<bool>` as if it took a value
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object.", metavar=FLAG)]
FormatJson = Annotated[bool, typer.Option("--json", help="The same as --format json.", metavar=FLAG)]
# The hidden --out of `report` and `history`: their HTML file was --out before it was --report everywhere.
OldReportFlag = Annotated[Path | None, typer.Option("--out", hidden=True)]


def report_path(report: Path | None, old_flag: Path | None) -> Path | None:
    """The HTML file of --report, or of the old --out; both given is bad input."""
    if report is not None and old_flag is not None:
        raise UserError("--out is the old name of --report: give one of them")
    return report if report is not None else old_flag


def evaluation_spec(task: str | None, limit: int | None) -> EvalSpec | None:
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


Device = Annotated[str | None, typer.Option("--device", help="cuda, cuda:N or cpu.", show_default="from --gpu")]
SpacePath = Annotated[
    Path | None,
    typer.Option("--space", help="Search-space YAML.", show_default="the packaged autotune/space/default.yaml"),
]
TrustRemoteCode = Annotated[
    bool, typer.Option("--trust-remote-code", help="Allow the model's own code to run.", metavar=FLAG)
]
Artifacts = Annotated[
    str | None,
    typer.Option(
        "--artifacts",
        help="Where trial logs and reports are stored as Optuna artifacts: a folder, s3://BUCKET or gs://BUCKET.",
        show_default="<study>.artifacts beside the SQLite file",
    ),
]
_StoragePatience = Annotated[
    str,
    typer.Option(
        "--storage-patience",
        help="How long to wait out a storage that cannot be reached, is locked or is full, before stopping "
        "(exit 75); a search or worker keeps a measured result on local disk meanwhile.",
    ),
]
_Model = Annotated[str, typer.Option("--model", help="Hub id, local folder, or 'demo' (built-in, offline).")]
_Revision = Annotated[str | None, typer.Option("--revision", help="Model revision on the hub.")]
_AssistantModel = Annotated[
    str | None,
    typer.Option(
        "--assistant-model",
        help="The draft model speculative=assistant loads: a hub id or folder sharing the model's tokenizer.",
        show_default="the demo's draft with --model demo, else none",
    ),
]
_Gpu = Annotated[str, typer.Option("--gpu", help="Hardware profile (see `autotune gpus`), or auto.")]
_Price = Annotated[
    float | None, typer.Option("--price", min=0, help="GPU price per hour.", show_default="the profile's")
]
_Budget = Annotated[str | None, typer.Option("--budget", help="Wall-clock budget: 90s, 30m, 2h.")]
_Trials = Annotated[int | None, typer.Option("--trials", min=1, help="Run at most N trials.")]
_TrialTimeout = Annotated[str, typer.Option("--trial-timeout", help="Kill a trial after this long.")]


def _default_tolerance(figure: str) -> str:
    """ "GPU 5%, CPU 25%": a tolerance's defaults by device (analysis/tolerances.py), one where they agree."""
    on_gpu, on_cpu = (getattr(DEFAULT_TOLERANCES[device], figure) for device in ("cuda", "cpu"))
    return f"{on_gpu:.0%}" if on_gpu == on_cpu else f"GPU {on_gpu:.0%}, CPU {on_cpu:.0%}"


_Threshold = Annotated[
    str | None,
    typer.Option(
        "--threshold",
        help="Throughput loss that is a regression: 5%, 0.05.",
        show_default=_default_tolerance("throughput"),
    ),
]
_MemoryTolerance = Annotated[
    str | None,
    typer.Option(
        "--memory-tolerance",
        help="Extra peak memory that still meets a level.",
        show_default=_default_tolerance("memory"),
    ),
]
_KlTolerance = Annotated[
    str | None,
    typer.Option("--kl-tolerance", help="Extra KL that still meets a level.", show_default=_default_tolerance("kl")),
]
_AccuracyTolerance = Annotated[
    str | None,
    typer.Option(
        "--accuracy-tolerance",
        help="Task accuracy a configuration may lose, as a share of the night before's, beyond chance (--eval).",
        show_default=_default_tolerance("accuracy"),
    ),
]
_FlipsTolerance = Annotated[
    str | None,
    typer.Option(
        "--flips-tolerance",
        help="More of the task's items a configuration may flip, in points, beyond chance (--eval).",
        show_default=_default_tolerance("flips"),
    ),
]


# ------------------------------------------------------------------------------------ groups


def model_spec(
    model: _Model,
    revision: _Revision = None,
    trust_remote_code: TrustRemoteCode = False,
    assistant_model: _AssistantModel = None,
) -> ModelSpec:
    return ModelSpec(model, revision=revision, trust_remote_code=trust_remote_code, assistant=assistant_model)


def hardware_spec(gpu: _Gpu = HardwareSpec.gpu, device: Device = None, price: _Price = None) -> HardwareSpec:
    return HardwareSpec(gpu, device, price)


def storage_patience_s(storage_patience: _StoragePatience = DEFAULT_STORAGE_PATIENCE) -> float:
    return parse_duration(storage_patience, "--storage-patience")


StoragePatienceS = Annotated[float, Group(storage_patience_s)]


def trial_timeout_s(trial_timeout: _TrialTimeout = DEFAULT_TRIAL_TIMEOUT) -> float:
    return parse_duration(trial_timeout, "--trial-timeout")


TrialTimeoutS = Annotated[float, Group(trial_timeout_s)]


@with_groups
def budget_spec(*, budget: _Budget = None, trials: _Trials = None, timeout_s: TrialTimeoutS) -> BudgetSpec:
    return BudgetSpec(parse_duration(budget) if budget else None, trials, timeout_s)


def given_tolerances(
    threshold: _Threshold = None,
    memory_tolerance: _MemoryTolerance = None,
    kl_tolerance: _KlTolerance = None,
    accuracy_tolerance: _AccuracyTolerance = None,
    flips_tolerance: _FlipsTolerance = None,
) -> GivenTolerances:
    return GivenTolerances(
        throughput=_fraction(threshold, "--threshold"),
        memory=_fraction(memory_tolerance, "--memory-tolerance"),
        kl=_fraction(kl_tolerance, "--kl-tolerance"),
        accuracy=_fraction(accuracy_tolerance, "--accuracy-tolerance"),
        flips=_fraction(flips_tolerance, "--flips-tolerance"),
    )


def _fraction(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise UserError(f"{flag} {text!r} is not a share: write it like 5% or 0.05") from None
    if not 0 <= value < 1:
        raise UserError(f"{flag} {text!r} must be between 0% and 100%")
    return value


Model = Annotated[ModelSpec, Group(model_spec)]
Hardware = Annotated[HardwareSpec, Group(hardware_spec)]
Budget = Annotated[BudgetSpec, Group(budget_spec)]
ToleranceFlags = Annotated[GivenTolerances, Group(given_tolerances)]
