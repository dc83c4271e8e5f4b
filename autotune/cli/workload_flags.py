"""The workload's flags: its kind, the batch and the lengths of one shape, the user's prompts, a trace to replay
(traffic_flags.py), and the flags the workload kinds declare (autotune/workloads/), collected from their handlers and
named nowhere else. Together they are one group, `Workload`, of every command that runs the model.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from autotune.cli.flags import Command, Group
from autotune.cli.traffic_flags import Traffic, TrafficRequests, traffic_ref
from autotune.data import load_prompts
from autotune.errors import UserError
from autotune.extras import why_missing
from autotune.figures.capacity import parse_batch_sizes
from autotune.specs import WorkloadSpec
from autotune.workloads import KINDS, Flag, foreign_flags, kind_flags, workload_kind

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


@_taking_kind_flags
def workload_spec(
    kind: _WorkloadKind = WorkloadSpec.kind,
    batch_size: _BatchSize = str(WorkloadSpec.batch_size),
    input_len: _InputLen = WorkloadSpec.input_len,
    output_len: _OutputLen = WorkloadSpec.output_len,
    prompts: _Prompts = None,
    traffic: Traffic = None,
    traffic_requests: TrafficRequests = None,
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


def port_problem(flag: Flag, port: int) -> str | None:
    """Why a server of the kind's trials could not bind this port here, or None."""
    from autotune.serving.server import bind_problem  # imports httpx: only once the kind's extra is known there

    if problem := bind_problem(port):
        return f"{flag.name} {port} cannot be bound on 127.0.0.1 ({problem}); give a free port or none"
    return None


Workload = Annotated[WorkloadSpec, Group(workload_spec)]
