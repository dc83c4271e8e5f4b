"""The commands that measure without a study: `measure` (one configuration, in the trial worker the search uses) and
`ceiling` (the decode ceiling, a hand-written loop). Each checks its flags, calls the library and prints what it
returns."""

from __future__ import annotations

from typing import Annotated

import typer

from autotune.cli.flags import FLAG, AsJson, Hardware, Model, SpacePath, TrialTimeoutS, with_groups
from autotune.cli.measure_printers import print_ceiling_failure, print_ceilings, print_measurement
from autotune.cli.workload_flags import Workload
from autotune.errors import UserError
from autotune.specs import BudgetSpec, SearchRequest
from autotune.workloads.base import MIN_SECONDS


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
