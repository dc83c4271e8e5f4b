"""The flags the commands share, each written once: typed `Annotated` aliases, and groups of them.

A group is a function whose parameters are flags and whose result is one spec, built and checked
once. A command names the spec in its signature (`workload: Workload`) and `with_groups` puts the
group's flags in its place, so `search`, `measure` and `worker` share them instead of repeating them.
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
from autotune.data import DEMO_TRACE, load_prompts
from autotune.errors import UserError
from autotune.extras import why_missing
from autotune.figures.capacity import parse_batch_sizes
from autotune.specs import (
    DEFAULT_STORAGE_PATIENCE,
    DEFAULT_TRIAL_TIMEOUT,
    BudgetSpec,
    HardwareSpec,
    ModelSpec,
    WorkloadSpec,
)
from autotune.traffic import DEFAULT_WINDOW, TrafficRef, read_trace
from autotune.units import parse_duration
from autotune.workloads import KINDS, Flag, foreign_flags, kind_flags, workload_kind

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
_WorkloadKind = Annotated[
    str,
    typer.Option(
        "--workload",
        help=", ".join(f"{kind.name} ({kind.help})" for kind in KINDS.values()) + ".",
    ),
]
_BatchSize = Annotated[
    str,
    typer.Option(
        "--batch-size",
        help="Prompts per generation: 8; or a range, 1-128 (by doubling), or a list, 1,8,32: throughput searches them "
        "for the largest batch within --slo and the memory.",
    ),
]
_InputLen = Annotated[int, typer.Option("--input-len", min=1, help="Tokens per prompt.")]
_OutputLen = Annotated[int, typer.Option("--output-len", min=2, help="Tokens generated per prompt.")]
_Prompts = Annotated[
    Path | None, typer.Option("--prompts", help="Your prompts: .jsonl ({'prompt': ...}) or text, one per line.")
]
_Traffic = Annotated[
    Path | None,
    typer.Option(
        "--traffic",
        help="A request trace every trial replays instead of one shape: each request with its own input and output "
        "length, and its arrival and conversation where the file has them. A .jsonl of requests (docs/traffic.md), "
        "Mooncake's .jsonl, an Azure LLM inference trace's .csv, ShareGPT conversations (.json), or demo (built in).",
    ),
]
_TrafficRequests = Annotated[
    int | None,
    typer.Option(
        "--traffic-requests",
        min=1,
        help="How many requests of the --traffic trace each trial replays, from its first.",
        show_default=f"{DEFAULT_WINDOW}, or all of a shorter trace",
    ),
]


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


# ------------------------------------------------------------------------------------ the workload kinds' flags

# The flags some workload kinds declare (autotune/workloads/): options of every command that takes a workload.
KIND_FLAGS = kind_flags(KINDS.values())


def _kind_option(flag: Flag) -> inspect.Parameter:
    """A kind's flag as Typer reads it: None when not given."""
    show_default = flag.show_default or True
    option = typer.Option(flag.name, help=flag.help, show_default=show_default, min=flag.min_value, max=flag.max_value)
    annotation = Annotated[flag.value_type | None, option]
    return inspect.Parameter(flag.parameter, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)


def _taking_kind_flags(build: Command) -> Command:
    """`build`, whose `**kind_values` Typer and `with_groups` read as the kinds' flags, one parameter each."""
    signature = inspect.signature(build, eval_str=True)
    fixed = [parameter for parameter in signature.parameters.values() if parameter.kind != parameter.VAR_KEYWORD]
    parameters = [*fixed, *map(_kind_option, KIND_FLAGS)]
    build.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]  # what Typer reads
    return build


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


@_taking_kind_flags
def workload_spec(
    kind: _WorkloadKind = WorkloadSpec.kind,
    batch_size: _BatchSize = str(WorkloadSpec.batch_size),
    input_len: _InputLen = WorkloadSpec.input_len,
    output_len: _OutputLen = WorkloadSpec.output_len,
    prompts: _Prompts = None,
    traffic: _Traffic = None,
    traffic_requests: _TrafficRequests = None,
    **kind_values: Any,
) -> WorkloadSpec:
    """The workload of the flags; `kind_values`: the values of KIND_FLAGS, by parameter name (None: not given)."""
    workload = workload_kind(kind)
    given = {flag.name: kind_values.get(flag.parameter) for flag in KIND_FLAGS}
    if problem := foreign_flags(workload, given):
        raise UserError(problem)
    sizes = parse_batch_sizes(batch_size)
    if len(sizes) > 1 and workload.probes != "batch":
        probing = " or ".join(other.name for other in KINDS.values() if other.probes == "batch")
        raise UserError(f"--batch-size {batch_size}: batch sizes are searched under --workload {probing}; give one")
    if missing := why_missing(f"--workload {kind}", workload.packages):
        raise UserError(missing)
    for flag in workload.flags:
        if flag.port and given[flag.name] is not None and (problem := port_problem(flag, given[flag.name])):
            raise UserError(problem)
    if prompts is not None:
        load_prompts(prompts)  # bad prompts are bad input, before anything runs
    path = str(prompts.resolve()) if prompts else None
    fields: dict[str, Any] = {"kind": kind, "batch_size": sizes[-1], "input_len": input_len, "output_len": output_len}
    fields |= {"prompts_path": path, "batch_sizes": sizes if len(sizes) > 1 else []}
    lengths = {
        "--input-len": (input_len, WorkloadSpec.input_len),
        "--output-len": (output_len, WorkloadSpec.output_len),
    }
    fields["traffic"] = traffic_ref(traffic, traffic_requests, prompts, lengths)
    spec = WorkloadSpec(**(fields | workload.options(given)))  # a kind's own flags may decide a field of the spec
    return workload.as_run(spec)  # what its trials run, as the study stores it


def traffic_ref(
    path: Path | None, requests: int | None, prompts: Path | None, lengths: dict[str, tuple[int, int]]
) -> TrafficRef | None:
    """The trace --traffic names, read and checked now (bad input before anything runs), with the window of it each
    trial replays; None without --traffic. `lengths`: --input-len and --output-len, each with its default."""
    if path is None:
        if requests is not None:
            raise UserError("--traffic-requests goes with --traffic FILE")
        return None
    if prompts is not None:
        raise UserError("--prompts and --traffic both give the prompts: give one of them")
    for flag, (value, default) in lengths.items():  # at its default, a length only shapes the quality check
        if value != default:
            raise UserError(f"{flag} {value}: each request of --traffic has its own lengths; leave out {flag}")
    trace = read_trace(DEMO_TRACE if str(path) == "demo" and not path.exists() else path)
    if requests is not None and requests > len(trace.requests):
        raise UserError(
            f"--traffic-requests {requests}: {trace.name} holds {len(trace.requests)} requests; give at most that"
        )
    return TrafficRef.of(trace, min(requests or DEFAULT_WINDOW, len(trace.requests)))


def port_problem(flag: Flag, port: int) -> str | None:
    """Why a server of the kind's trials could not bind this port here, or None."""
    from autotune.serving.server import bind_problem  # imports httpx: only once the kind's extra is known there

    if problem := bind_problem(port):
        return f"{flag.name} {port} cannot be bound on 127.0.0.1 ({problem}); give a free port or none"
    return None


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
Workload = Annotated[WorkloadSpec, Group(workload_spec)]
ToleranceFlags = Annotated[GivenTolerances, Group(given_tolerances)]
