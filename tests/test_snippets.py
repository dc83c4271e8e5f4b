"""Plans, rendered code and the serve command, checked as data (and compiled, not run, here)."""

import ast
import json

from autotune.report.snippets import json_snippet, python_snippet, serve_command
from autotune.space import Target, build_plan
from autotune.space.plan import Plan

COMPILED_STATIC = {
    "dtype": "bfloat16",
    "attn_implementation": "sdpa",
    "quantization": "none",
    "batching": "generate",
    "cache_implementation": "static",
    "compile": "default",
}
CONTINUOUS_4BIT = {
    "dtype": "float16",
    "attn_implementation": "eager",
    "quantization": "bnb-4bit",
    "batching": "continuous",
    "max_batch_tokens": 512,
}


def test_plan_round_trips_through_json():
    plan = build_plan(CONTINUOUS_4BIT, Target("cuda"))
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_compile_on_cpu_sets_the_switch_generate_needs_and_not_on_cuda():
    cpu = build_plan(COMPILED_STATIC, Target("cpu")).generate["compile_config"]
    cuda = build_plan(COMPILED_STATIC, Target("cuda")).generate["compile_config"]
    assert cpu.attrs == {"_compile_all_devices": True}
    assert cuda.attrs == {}
    assert cpu.kwargs == cuda.kwargs == {"mode": "default"}


def test_four_bit_computes_in_the_chosen_dtype():
    plan = build_plan(CONTINUOUS_4BIT, Target("cuda"))
    config = plan.load["quantization_config"]
    assert config.path == "transformers.BitsAndBytesConfig"
    assert config.kwargs["bnb_4bit_compute_dtype"].path == "torch.float16"
    assert plan.batching == "continuous"
    assert plan.continuous == {"auto_switch_to_flash": False, "max_batch_tokens": 512}


def test_python_snippet_is_valid_python_with_the_knobs():
    for config in (COMPILED_STATIC, CONTINUOUS_4BIT):
        for target in ("cpu", "cuda"):
            code = python_snippet("org/model", build_plan(config, Target(target)), target, 32)
            ast.parse(code)
            assert "from_pretrained(" in code
            assert f"dtype=torch.{config['dtype']}" in code
    code = python_snippet("org/model", build_plan(COMPILED_STATIC, Target("cpu")), "cpu", 32)
    assert "compile_config = CompileConfig(mode='default')" in code
    assert "compile_config._compile_all_devices = True" in code
    assert "cache_implementation='static'" in code
    code = python_snippet("org/model", build_plan(CONTINUOUS_4BIT, Target("cuda")), "cuda", 32)
    assert "generate_batch(" in code and "ContinuousBatchingConfig(" in code and "BitsAndBytesConfig(" in code


def test_serve_command_maps_knobs_to_its_flags_and_names_the_rest():
    command = serve_command("org/model", build_plan(CONTINUOUS_4BIT, Target("cuda")), "cuda:0")
    assert command.startswith("transformers serve org/model --dtype float16 --attn-implementation eager")
    assert "--quantization bnb-4bit --continuous-batching --cb-max-batch-tokens 512 --device cuda:0" in command
    quantized_cache = {**COMPILED_STATIC, "cache_implementation": "quantized"}
    del quantized_cache["compile"]
    command = serve_command("m", build_plan(quantized_cache, Target("cuda")), "cuda")
    assert "# transformers serve has no flag for: cache_implementation=quantized" in command


def test_json_snippet_is_plain_json():
    document = json.loads(json_snippet("m", CONTINUOUS_4BIT, build_plan(CONTINUOUS_4BIT, Target("cuda"))))
    assert document["from_pretrained"]["dtype"] == "torch.float16"
    assert document["from_pretrained"]["quantization_config"]["class"] == "transformers.BitsAndBytesConfig"
    assert document["config"] == CONTINUOUS_4BIT


def test_plans_can_only_name_torch_and_transformers():
    import pytest

    from autotune.space.plan import Ref, decode

    with pytest.raises(ValueError, match="torch"):
        Ref("os.system")
    with pytest.raises(ValueError, match="torch"):
        decode({"$call": "subprocess.run", "kwargs": {}})
