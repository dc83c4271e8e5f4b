"""Weight quantization beyond bitsandbytes (torchao, optimum-quanto) and the quantized KV cache's backends:
their plans, the rules between them and compile / inference_mode / dtype, missing packages, and what measure refuses."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from autotune.paths import PACKAGED_SPACE
from autotune.process.results import Outcome
from autotune.profiles import PROFILES
from autotune.report.snippets import python_snippet, serve_command
from autotune.space import KNOBS, Call, Plan, Target, build_plan, load_space
from autotune.worker.failures import UnsupportedError, classify
from tests.conftest import run_cli, run_main

BASELINE = {"dtype": "float32", "attn_implementation": "sdpa", "quantization": "none", "batching": "generate"}
SPACE = load_space(PACKAGED_SPACE)
QUANTIZED_CACHE = {**BASELINE, "cache_implementation": "quantized"}
TORCHAO_VALUES = ("torchao-int8", "torchao-int4", "torchao-fp8")
QUANTO_VALUES = ("quanto-int8", "quanto-int4", "quanto-float8")


def _plan(config: dict) -> Plan:
    return build_plan(config, Target("cpu"))


# ------------------------------------------------------------------------------------------------ plans


def test_torchao_values_load_with_a_torchao_config_object_and_quanto_values_with_quanto_config():
    int8 = _plan({**BASELINE, "quantization": "torchao-int8"}).load["quantization_config"]
    assert int8 == Call("transformers.TorchAoConfig", {"quant_type": Call("torchao.quantization.Int8WeightOnlyConfig")})
    int4 = _plan({**BASELINE, "dtype": "bfloat16", "quantization": "torchao-int4"}).load["quantization_config"]
    assert int4.kwargs["quant_type"].kwargs == {"int4_packing_format": "tile_packed_to_4d"}
    for value, weights in zip(QUANTO_VALUES, ("int8", "int4", "float8"), strict=True):
        plan = _plan({**BASELINE, "quantization": value})
        assert plan.load["quantization_config"] == Call("transformers.QuantoConfig", {"weights": weights})
        assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_every_new_value_builds_the_real_transformers_config():
    import torchao.quantization
    import transformers

    from autotune.worker.loading import materialize

    expected = {
        "torchao-int8": torchao.quantization.Int8WeightOnlyConfig,
        "torchao-int4": torchao.quantization.Int4WeightOnlyConfig,
        "torchao-fp8": torchao.quantization.Float8WeightOnlyConfig,
    }
    for value, config_class in expected.items():
        config = materialize(_plan({**BASELINE, "quantization": value}).load["quantization_config"])
        assert isinstance(config, transformers.TorchAoConfig) and isinstance(config.quant_type, config_class)
    for value in QUANTO_VALUES:
        config = materialize(_plan({**BASELINE, "quantization": value}).load["quantization_config"])
        assert isinstance(config, transformers.QuantoConfig) and config.weights == value.split("-")[1]


def test_serve_has_no_flag_for_torchao_or_quanto_and_the_snippet_imports_torchao():
    plan = _plan({**BASELINE, "quantization": "torchao-int8"})
    assert plan.not_servable == ["quantization=torchao-int8 (serve --quantization takes bnb-4bit or bnb-8bit only)"]
    assert "--quantization" not in plan.serve_flags
    assert "serve --quantization takes bnb-4bit" in serve_command("org/model", plan, "cpu")
    code = python_snippet("org/model", plan, "cpu", 16)
    ast.parse(code)
    assert "\nimport torchao.quantization\n" in code
    assert "quantization_config=TorchAoConfig(quant_type=torchao.quantization.Int8WeightOnlyConfig())" in code
    quanto = python_snippet("org/model", _plan({**BASELINE, "quantization": "quanto-int8"}), "cpu", 16)
    assert "quantization_config=QuantoConfig(weights='int8')" in quanto and "torchao" not in quanto
    bnb = _plan({**BASELINE, "quantization": "bnb-8bit"})
    assert bnb.serve_flags[-2:] == ["--quantization", "bnb-8bit"] and not bnb.not_servable


def test_the_kv_cache_backend_is_the_plan_s_cache_config():
    assert _plan({**QUANTIZED_CACHE, "kv_cache_backend": "fp8"}).generate["cache_config"] == {"backend": "fp8"}
    for backend in ("quanto", "hqq"):
        plan = _plan({**QUANTIZED_CACHE, "kv_cache_backend": backend})
        assert plan.generate["cache_config"] == {"backend": backend, "nbits": 4}
    assert "cache_config" not in _plan({**BASELINE, "kv_cache_backend": "fp8"}).generate  # no quantized cache
    assert KNOBS["kv_cache_backend"].default == "quanto"  # generate()'s backend when cache_config names none


# ------------------------------------------------------------------------------------------------ rules


def _violation(config: dict) -> str | None:
    return SPACE.violation(SPACE.normalize(config))


def test_torchao_compiles_while_bitsandbytes_and_quanto_never_do():
    compiled = {**BASELINE, "cache_implementation": "static", "compile": "default"}
    assert _violation({**compiled, "quantization": "torchao-int8"}) is None
    assert "bitsandbytes models are never compiled" in (_violation({**compiled, "quantization": "bnb-8bit"}) or "")
    quanto = _violation({**compiled, "quantization": "quanto-int8"}) or ""
    assert "optimum-quanto models are never compiled" in quanto


def test_quanto_int4_is_never_run_under_inference_mode():
    reason = _violation({**BASELINE, "quantization": "quanto-int4", "execution_mode": "inference_mode"}) or ""
    assert "Cannot set version_counter for inference tensor" in reason
    assert _violation({**BASELINE, "quantization": "quanto-int4", "execution_mode": "no_grad"}) is None
    assert _violation({**BASELINE, "quantization": "quanto-int8", "execution_mode": "inference_mode"}) is None


def test_torchao_int4_needs_bfloat16_and_a_cuda_gpu():
    assert "bfloat16 weights only" in (_violation({**BASELINE, "quantization": "torchao-int4"}) or "")
    assert _violation({**BASELINE, "dtype": "bfloat16", "quantization": "torchao-int4"}) is None
    cpu = SPACE.prune(PROFILES["cpu"].why_not_value)
    assert "torchao-int4" not in cpu.knob("quantization").values
    assert "every int4 packing fails on CPU" in cpu.removed["quantization"]["torchao-int4"]
    assert "torchao-int4" in SPACE.prune(PROFILES["a10g"].why_not_value).knob("quantization").values
    assert "torchao-int4" not in SPACE.prune(PROFILES["t4"].why_not_value).knob("quantization").values


def test_the_backend_knob_applies_only_to_a_quantized_cache():
    assert (
        SPACE.normalize({**BASELINE, "cache_implementation": "dynamic", "kv_cache_backend": "hqq"}).get(
            "kv_cache_backend"
        )
        is None
    )
    assert SPACE.normalize({**QUANTIZED_CACHE, "kv_cache_backend": "hqq"})["kv_cache_backend"] == "hqq"
    assert SPACE.knob("kv_cache_backend").values == KNOBS["kv_cache_backend"].choices


def test_memory_orders_four_bits_below_eight_below_none():
    ranks = KNOBS["quantization"].memory_rank
    assert ranks("torchao-int4") < ranks("torchao-int8") == ranks("quanto-float8") < ranks("none")
    assert KNOBS["kv_cache_backend"].memory_rank("quanto") < KNOBS["kv_cache_backend"].memory_rank("fp8")


# ---------------------------------------------------------------------------------------- missing packages


@pytest.mark.parametrize(("value", "pip"), [("torchao-int8", "torchao"), ("quanto-float8", "optimum-quanto")])
def test_a_missing_quantization_package_is_unsupported_with_what_to_install(monkeypatch, value, pip):
    from autotune.worker import generation_trial

    installed = generation_trial.installed_version
    monkeypatch.setattr(
        generation_trial, "installed_version", lambda wanted: None if wanted.package == pip else installed(wanted)
    )
    config = {**BASELINE, "quantization": value}
    with pytest.raises(
        UnsupportedError, match=rf"needs {pip}, which is not installed: pip install \"autotune\[quant\]\"$"
    ) as refused:
        generation_trial.refuse_what_cannot_run(config, _plan(config))
    classified = classify(refused.value, config)
    assert (classified.outcome, classified.knob, classified.certain) == (Outcome.UNSUPPORTED, "quantization", True)
    bnb = {**BASELINE, "quantization": "bnb-8bit"}
    generation_trial.refuse_what_cannot_run(bnb, _plan(bnb))  # bitsandbytes is installed: nothing to refuse


def test_torchao_int4_s_cpu_failure_blames_the_quantization_value():
    message = RuntimeError(
        "We encountered some issues during automatic conversion of the weights. For details look at the "
        "`CONVERSION` entries of the above report! Cause logged: AssertionError: Torch not compiled with CUDA enabled"
    )
    config = {**BASELINE, "dtype": "bfloat16", "quantization": "torchao-int4"}
    assert classify(message, config).outcome == Outcome.UNSUPPORTED


# ------------------------------------------------------------------------------------------ the command line


def test_measure_refuses_torchao_int4_on_cpu_and_quanto_int4_under_inference_mode(tmp_path: Path, cli_env):
    int4 = run_main(["measure", "--model", "demo", "--device", "cpu", "--set", "dtype=bfloat16",
                     "--set", "quantization=torchao-int4"], tmp_path, cli_env)  # fmt: skip
    assert int4.returncode == 2 and "Traceback" not in int4.stderr
    assert int4.stderr == (
        "autotune: error: quantization=torchao-int4 is not measured on profile cpu: needs a CUDA GPU (torchao int4 "
        "runs tinygemm's CUDA kernel (Ampere or newer); every int4 packing fails on CPU)\n"
    )
    quanto = run_cli(["measure", "--model", "demo", "--device", "cpu", "--set", "quantization=quanto-int4",
                      "--set", "execution_mode=inference_mode"], tmp_path, cli_env)  # fmt: skip
    assert quanto.returncode == 2 and "Traceback" not in quanto.stderr
    assert "Cannot set version_counter for inference tensor" in quanto.stderr
    assert len(quanto.stderr.splitlines()) == 1


# Every value's real run on CPU, with its quality figures (KL, top-1 agreement, perplexity), and each KV-cache
# backend's, are conformance cases (benchmarks/conformance/), measured once per CI run per transformers version.
