"""The execution_mode knob: generate() as it is (no_grad) or inside torch.inference_mode(), in the plan,
the worker and the exported snippets; refused where it does not reach (continuous batching)."""

from __future__ import annotations

import ast
import json

from autotune.paths import PACKAGED_SPACE, demo_model_path
from autotune.report.snippets import json_snippet, python_snippet, serve_command
from autotune.space import Target, build_plan, load_space
from autotune.space.plan import Call, Plan
from autotune.specs import ModelSpec, WorkloadSpec
from autotune.study import migrations

BASE = {"dtype": "float32", "attn_implementation": "sdpa", "quantization": "none", "batching": "generate"}


def test_the_knob_sets_the_plan_and_old_plans_read_as_they_ran():
    plan = build_plan({**BASE, "execution_mode": "inference_mode"}, Target("cpu"))
    assert plan.contexts == [Call("torch.inference_mode")]
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    newer = {key: value for key, value in plan.to_json().items() if key != "contexts"}
    older = migrations.plan({**newer, "execution_mode": "inference_mode"})  # stored by an older version
    assert Plan.from_json(older).contexts == plan.contexts  # type: ignore[arg-type]
    assert Plan.from_json(migrations.plan({**newer, "execution_mode": "no_grad"})).contexts == []  # type: ignore[arg-type]
    assert Plan.from_json(migrations.plan(newer)).contexts == []  # type: ignore[arg-type] - stored before the knob
    assert build_plan({**BASE, "execution_mode": "no_grad"}, Target("cpu")) == build_plan(BASE, Target("cpu"))


def test_the_snippet_wraps_generate_in_inference_mode_and_serve_says_it_has_no_flag():
    plan = build_plan({**BASE, "cache_implementation": "static", "compile": "default",
                       "execution_mode": "inference_mode"}, Target("cpu"))  # fmt: skip
    code = python_snippet("org/model", plan, "cpu", 16)
    ast.parse(code)
    assert "import torch\n" in code and "with torch.inference_mode():\n    outputs = model.generate(\n" in code
    assert "\n    )\nprint(" in code  # the call, and only the call, is inside the block
    assert json.loads(json_snippet("org/model", {}, plan))["contexts"] == [{"class": "torch.inference_mode"}]
    assert "execution_mode=inference_mode" in serve_command("org/model", plan, "cpu").splitlines()[1]
    assert "inference_mode" not in python_snippet("org/model", build_plan(BASE, Target("cpu")), "cpu", 16)


def test_continuous_batching_refuses_inference_mode_with_its_reason():
    space = load_space(PACKAGED_SPACE)
    config = space.normalize({**BASE, "batching": "continuous", "max_batch_tokens": 256,
                              "execution_mode": "inference_mode"})  # fmt: skip
    assert "its own thread under torch.no_grad" in (space.violation(config) or "")
    assert space.violation(space.normalize({**BASE, "cache_implementation": "static", "compile": "default",
                                            "execution_mode": "inference_mode"})) is None  # fmt: skip


def test_the_worker_generates_inside_inference_mode_only_when_asked(cache_dir):
    from transformers import AutoTokenizer

    from autotune.worker.demo_model import ensure_demo_model
    from autotune.worker.generation import PaddedGeneration, build_inputs
    from autotune.worker.loading import load_model
    from autotune.worker.measurement.token_clock import TokenClock

    path = str(ensure_demo_model(cache_dir))
    assert path == str(demo_model_path(cache_dir))
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    spec = WorkloadSpec(batch_size=2, input_len=16, output_len=4)
    inputs = build_inputs(tokenizer, spec, spec.batch_size)
    for mode, expected in (("no_grad", False), ("inference_mode", True)):
        plan = build_plan({**BASE, "execution_mode": mode}, Target("cpu"))
        model = load_model(ModelSpec("demo", path=path), plan, "cpu")
        workload = PaddedGeneration(model, plan, inputs, spec, tokenizer.pad_token_id)
        with workload.contexts():
            output = workload._generate(TokenClock(model.device))
        assert output.is_inference() is expected, mode
        assert len(workload.run().generated[0]) == 4


def test_the_baseline_and_the_reference_run_generate_as_it_is():
    from autotune.measure.prepare import baseline_config
    from autotune.profiles import PROFILES

    space = load_space(PACKAGED_SPACE)
    baseline = baseline_config(space, "float32", PROFILES["cpu"], "throughput")
    assert baseline["execution_mode"] == "no_grad"  # left unset, the sampler would pick a value for it
