"""The sdpa_backend knob: a kernel forced as a context of the plan; only with sdpa attention; off CUDA, math only."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from autotune.measure.prepare import baseline_config
from autotune.paths import PACKAGED_SPACE
from autotune.profiles import PROFILES
from autotune.report.snippets import python_snippet, serve_command
from autotune.space import KNOBS, Call, Plan, Ref, Target, build_plan, load_space
from tests.conftest import run_main

SDPA = {"dtype": "float32", "attn_implementation": "sdpa", "quantization": "none", "batching": "generate"}
SPACE = load_space(PACKAGED_SPACE)
MATH = Call("torch.nn.attention.sdpa_kernel", {"backends": Ref("torch.nn.attention.SDPBackend.MATH")})


def test_a_forced_kernel_is_a_context_of_the_plan_and_auto_is_none():
    plan = build_plan({**SDPA, "sdpa_backend": "math"}, Target("cpu"))
    assert plan.contexts == [MATH]
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert build_plan({**SDPA, "sdpa_backend": "auto"}, Target("cpu")) == build_plan(SDPA, Target("cpu"))
    flash = build_plan({**SDPA, "sdpa_backend": "flash"}, Target("cuda")).contexts[0]
    assert flash.kwargs["backends"] == Ref("torch.nn.attention.SDPBackend.FLASH_ATTENTION")


def test_every_forced_kernel_names_a_real_sdpa_backend_and_forces_it():
    import torch

    from autotune.worker.loading import materialize

    for value in KNOBS["sdpa_backend"].choices or ():
        contexts = build_plan({**SDPA, "sdpa_backend": value}, Target("cuda")).contexts
        assert all(isinstance(materialize(call.kwargs["backends"]), torch.nn.attention.SDPBackend) for call in contexts)
    (context,) = build_plan({**SDPA, "sdpa_backend": "math"}, Target("cpu")).contexts
    with materialize(context):
        assert torch.backends.cuda.math_sdp_enabled()
        assert not (torch.backends.cuda.flash_sdp_enabled() or torch.backends.cuda.mem_efficient_sdp_enabled())


def test_the_snippet_generates_inside_sdpa_kernel_and_serve_says_it_has_no_flag():
    plan = build_plan({**SDPA, "sdpa_backend": "math"}, Target("cpu"))
    code = python_snippet("org/model", plan, "cpu", 16)
    ast.parse(code)
    assert code.startswith("import torch\n")
    assert "\nwith torch.nn.attention.sdpa_kernel(backends=torch.nn.attention.SDPBackend.MATH):\n    outputs = " in code
    assert "sdpa_backend=math" in serve_command("org/model", plan, "cpu").splitlines()[1]
    assert "sdpa_kernel" not in python_snippet("org/model", build_plan(SDPA, Target("cpu")), "cpu", 16)


def test_it_applies_only_with_sdpa_attention_and_never_under_continuous_batching():
    assert SPACE.normalize({**SDPA, "attn_implementation": "eager", "sdpa_backend": "math"}).get("sdpa_backend") is None
    assert SPACE.violation(SPACE.normalize({**SDPA, "cache_implementation": "dynamic", "sdpa_backend": "math"})) is None
    continuous = SPACE.normalize({**SDPA, "batching": "continuous", "max_batch_tokens": 256, "sdpa_backend": "math"})
    assert "its own thread" in (SPACE.violation(continuous) or "")
    auto = SPACE.normalize({**SDPA, "batching": "continuous", "max_batch_tokens": 256, "sdpa_backend": "auto"})
    assert SPACE.violation(auto) is None


def test_efficient_and_cudnn_need_cuda_and_the_baseline_lets_torch_pick():
    cpu = SPACE.prune(PROFILES["cpu"].why_not_value)
    assert cpu.knob("sdpa_backend").values == ("auto", "flash", "math")  # torch has CPU flash and math kernels
    assert "CUDA" in cpu.removed["sdpa_backend"]["efficient"] and "CUDA" in cpu.removed["sdpa_backend"]["cudnn"]
    assert SPACE.prune(PROFILES["t4"].why_not_value).knob("sdpa_backend").values == ("auto", "efficient", "math")
    assert SPACE.prune(PROFILES["h100"].why_not_value).knob("sdpa_backend").values == KNOBS["sdpa_backend"].choices
    assert baseline_config(SPACE, "float32", PROFILES["cpu"], "throughput", "sdpa")["sdpa_backend"] == "auto"


def test_measure_refuses_a_cuda_kernel_on_cpu(tmp_path: Path, cli_env: dict[str, str]) -> None:
    args = ["measure", "--model", "demo", "--device", "cpu", "--set", "attn_implementation=sdpa",
            "--set", "sdpa_backend=efficient"]  # fmt: skip
    completed = run_main(args, tmp_path, cli_env)
    assert completed.returncode == 2 and "Traceback" not in completed.stderr
    expected = (
        "sdpa_backend=efficient is not measured on profile cpu: "
        "needs a CUDA GPU (the efficient sdpa kernel is a CUDA kernel)"
    )
    assert completed.stderr == f"autotune: error: {expected}\n"


# A real run with each kernel the cpu profile keeps (flash, math) is a conformance case (benchmarks/conformance/).
