"""Plans, rendered code and the serve command, checked as data (and compiled, not run, here)."""

import ast
import json

from autotune.report.snippets import json_snippet, python_snippet, serve_command
from autotune.space import Target, build_plan
from autotune.space.knobs.batching import paged_cache_for
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
    assert plan.continuous["max_batch_tokens"] == 512
    assert plan.continuous["auto_switch_to_flash"] is False


def test_continuous_batching_sizes_its_paged_cache_for_the_workload_in_the_plan():
    """Unsized, the paged cache takes ~90% of free GPU memory: peak memory would say nothing of the configuration."""
    plan = build_plan(CONTINUOUS_4BIT, Target("cuda", requests=8, tokens_per_request=192))
    assert plan.continuous | {"page_size": 32, "num_blocks": 8 * 6 + 2, "max_requests_per_batch": 8} == plan.continuous
    larger = build_plan(CONTINUOUS_4BIT, Target("cuda", requests=16, tokens_per_request=1000))
    assert larger.continuous["num_blocks"] == 16 * 32 + 2
    flags = " ".join(plan.serve_flags)
    assert "--continuous-batching --cb-block-size 32 --cb-num-blocks 50" in flags


def test_a_paged_cache_is_resized_for_the_batch_a_capacity_probe_chose():
    built = build_plan(CONTINUOUS_4BIT, Target("cuda", requests=64, tokens_per_request=192))  # the largest tried
    chosen = paged_cache_for(built, 16)
    assert chosen.continuous == built.continuous | {"num_blocks": 16 * 6 + 2, "max_requests_per_batch": 16}
    assert chosen.serve_flags[chosen.serve_flags.index("--cb-num-blocks") + 1] == "98"
    assert chosen == build_plan(CONTINUOUS_4BIT, Target("cuda", requests=16, tokens_per_request=192))
    assert built.continuous["num_blocks"] == 64 * 6 + 2  # the stored plan is left as it ran
    generate = build_plan(COMPILED_STATIC, Target("cuda", requests=64))
    assert paged_cache_for(generate, 16) is generate and paged_cache_for(built, 64) is built


def test_a_static_cache_without_compile_disables_generates_own_compilation():
    """On a GPU generate() compiles a static cache by itself unless told not to: "compile off" must be off."""
    for cache in ("static", "offloaded_static"):
        off = {**COMPILED_STATIC, "cache_implementation": cache, "compile": "off"}
        for target in ("cpu", "cuda"):
            plan = build_plan(off, Target(target))
            assert plan.generate["disable_compile"] is True
            assert "compile_config" not in plan.generate
            compiled = build_plan({**off, "compile": "reduce-overhead"}, Target(target))
            assert "disable_compile" not in compiled.generate
            assert compiled.generate["compile_config"].kwargs == {"mode": "reduce-overhead"}
    unset = {key: value for key, value in COMPILED_STATIC.items() if key != "compile"}
    assert build_plan(unset, Target("cuda")).generate["disable_compile"] is True
    dynamic = {**unset, "cache_implementation": "dynamic"}
    assert "disable_compile" not in build_plan(dynamic, Target("cuda")).generate


def test_static_cache_without_compile_is_not_what_serve_runs():
    plan = build_plan({**COMPILED_STATIC, "compile": "off"}, Target("cuda"))
    assert "--compile" not in plan.serve_flags
    assert any("static cache without compilation" in item for item in plan.not_servable)


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
    assert "--quantization bnb-4bit --continuous-batching --cb-block-size 32 --cb-num-blocks 50" in command
    assert "--cb-max-batch-tokens 512 --device cuda:0" in command
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
