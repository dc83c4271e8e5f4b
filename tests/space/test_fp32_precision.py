"""The fp32_precision knob (docs/adding-a-knob.md's worked example): generate() inside torch.backends.flags(), which
sets the internal precision of float32 matmuls; TensorFloat-32 on Ampere or newer GPUs, bfloat16 through oneDNN on
CPUs that have it, and only from the torch that has the setting."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from autotune.paths import PACKAGED_SPACE
from autotune.profiles import PROFILES
from autotune.report.snippets import python_snippet, serve_command
from autotune.space import Call, Target, build_plan, load_space, rules
from tests.conftest import run_cli

FLOAT32 = {"dtype": "float32", "attn_implementation": "sdpa", "quantization": "none", "batching": "generate"}
SPACE = load_space(PACKAGED_SPACE)


def test_the_plan_runs_generate_inside_the_precision_and_ieee_is_the_baseline():
    plan = build_plan({**FLOAT32, "fp32_precision": "tf32"}, Target("cuda"))
    assert plan.contexts == [Call("torch.backends.flags", {"fp32_precision": "tf32"})]
    code = python_snippet("org/model", plan, "cuda", 16)
    ast.parse(code)
    assert "with torch.backends.flags(fp32_precision='tf32'):\n    outputs = model.generate(" in code
    assert "fp32_precision=tf32" in serve_command("org/model", plan, "cuda").splitlines()[1]  # serve has no flag
    assert build_plan({**FLOAT32, "fp32_precision": "ieee"}, Target("cpu")) == build_plan(FLOAT32, Target("cpu"))


def test_it_applies_to_float32_under_generate_and_tf32_needs_an_ampere_gpu():
    assert SPACE.normalize({**FLOAT32, "fp32_precision": "tf32"})["fp32_precision"] == "tf32"
    assert "fp32_precision" not in SPACE.normalize({**FLOAT32, "dtype": "bfloat16", "fp32_precision": "tf32"})
    assert "fp32_precision" not in SPACE.normalize({**FLOAT32, "batching": "continuous", "fp32_precision": "tf32"})
    assert SPACE.prune(PROFILES["cpu"].why_not_value).knob("fp32_precision").values == ("ieee",)
    assert "Ampere" in (PROFILES["t4"].why_not_value("fp32_precision", "tf32") or "")
    assert PROFILES["a10g"].why_not_value("fp32_precision", "tf32") is None


def test_a_torch_without_the_setting_refuses_it_with_what_to_upgrade():
    config = {**FLOAT32, "fp32_precision": "bf16"}
    refused = rules.installation_problem(config, lambda requirement: "2.8.0" if requirement.package == "torch" else "9")
    assert refused is not None and (refused.knob, refused.value) == ("fp32_precision", "bf16")
    upgrade = "torch 2.8.0 has no fp32_precision setting of torch.backends.flags (it has from 2.9): upgrade torch"
    assert refused.message.endswith(upgrade)
    assert rules.installation_problem(config, lambda requirement: "2.13.0") is None


@pytest.mark.slow
def test_bfloat16_matmuls_run_on_this_cpu_and_move_the_quality_figures(tmp_path: Path, cli_env: dict[str, str]):
    """The float32 demo model with oneDNN computing its matmuls in bfloat16: it runs, and is no longer exact."""
    args = ["measure", "--model", "demo", "--device", "cpu", "--batch-size", "2", "--input-len", "32",
            "--output-len", "16", "--set", "dtype=float32", "--set", "fp32_precision=bf16", "--json"]  # fmt: skip
    completed = run_cli(args, tmp_path, cli_env)
    document = json.loads(completed.stdout.strip().splitlines()[-1])
    assert document["outcome"] == "ok", document["message"]
    assert document["config"]["fp32_precision"] == "bf16"
    assert document["metrics"]["kl_divergence"] > 0  # the float32 reference computes its matmuls in float32
