"""Weight quantization applied while loading: bitsandbytes, torchao, optimum-quanto."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from autotune.space.knobs.base import (
    DeviceType,
    Expectation,
    Knob,
    Needs,
    Recipe,
    Requires,
    Target,
    Value,
    declare_recipe,
    register,
)
from autotune.space.plan import Call, Plan, Ref


@register
class QuantizationKnob(Knob):
    name = "quantization"
    help = "weight quantization applied while loading: bitsandbytes, torchao weight-only, or optimum-quanto weights"
    short_name = "quant"
    choices = (
        "none",
        "bnb-8bit",
        "bnb-4bit",
        "torchao-int8",
        "torchao-int4",
        "torchao-fp8",
        "quanto-int8",
        "quanto-int4",
        "quanto-float8",
    )
    default = "none"
    after = ("dtype",)  # bnb-4bit computes in the loaded dtype
    failure_words = ("bitsandbytes", "bnb", "quantiz", "torchao", "quanto", "mslk")
    memory_ranks: ClassVar[dict[Value, int]] = {
        "none": 2,
        **dict.fromkeys(("bnb-8bit", "torchao-int8", "torchao-fp8", "quanto-int8", "quanto-float8"), 1),
        **dict.fromkeys(("bnb-4bit", "torchao-int4", "quanto-int4"), 0),
    }

    needs: ClassVar[Mapping[Value, Needs]] = {
        "torchao-int4": Needs(
            cuda=True,
            min_compute_capability=8.0,
            why="torchao int4 runs tinygemm's CUDA kernel (Ampere or newer); every int4 packing fails on CPU",
        )
    }
    requires: ClassVar[Mapping[Value, Requires]] = {
        **dict.fromkeys(("bnb-8bit", "bnb-4bit"), Requires("bitsandbytes")),
        **dict.fromkeys(("torchao-int8", "torchao-int4", "torchao-fp8"), Requires("torchao", extra="quant")),
        **dict.fromkeys(
            ("quanto-int8", "quanto-int4", "quanto-float8"), Requires("optimum-quanto", "optimum.quanto", extra="quant")
        ),
    }

    def duration_group(self, value: Value | None) -> object:
        return value

    def expect(self, value: Value, device: DeviceType) -> Expectation:
        """Against none. Memory: the weights in 8 bits are about half of bf16's, in 4 bits about a quarter
        [gpu-one, optims], the rest of the peak unchanged. None is expected to be faster [h100, cpu]."""
        if value == "none":
            return Expectation(spread=0.2)
        backend, _, scheme = str(value).partition("-")
        memory, kl = (0.35, 1e-2) if "4" in scheme else (0.55, 1e-3)  # 4bit, int4
        speed = _QUANTIZED_SPEED[device].get(backend, 0.5)
        # Quantizing while loading takes time. quanto-int4 on a CPU: still warming up after 34 s where a plain trial
        # took 4 s (the 3-minute demo search, 2026-11-25); int8 weights took about a plain trial's time [cpu].
        time = 10.0 if (value == "quanto-int4" and device == "cpu") else 1.3
        return Expectation(speed=speed, memory=memory, kl=kl, time=time)

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if value == "none":
            return
        backend, _, scheme = str(value).partition("-")
        if backend == "bnb":
            plan.load["quantization_config"] = _bitsandbytes_config(scheme, plan)
            plan.serve_flags += ["--quantization", str(value)]
            return
        if backend == "torchao":
            config = Call("transformers.TorchAoConfig", {"quant_type": _TORCHAO_CONFIGS[scheme]})
        else:
            config = Call("transformers.QuantoConfig", {"weights": scheme})
        plan.load["quantization_config"] = config
        plan.not_servable.append(f"quantization={value} (serve --quantization takes bnb-4bit or bnb-8bit only)")


def _bitsandbytes_config(scheme: str, plan: Plan) -> Call:
    if scheme == "8bit":
        return Call("transformers.BitsAndBytesConfig", {"load_in_8bit": True})
    compute_dtype = plan.load.get("dtype", Ref("torch.float32"))
    kwargs: dict[str, Any] = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    kwargs["bnb_4bit_compute_dtype"] = compute_dtype
    return Call("transformers.BitsAndBytesConfig", kwargs)


# Decode speed of quantized weights against unquantized ones, by backend: bitsandbytes 8-bit 0.25x and 4-bit 0.75x
# [h100] (LLM.int8's outlier decomposition is the slow one); weight-only torchao about even uncompiled; quanto and
# every backend on CPU slower [cpu].
_QUANTIZED_SPEED: dict[str, dict[str, float]] = {
    "cuda": {"bnb": 0.4, "torchao": 0.95, "quanto": 0.5},
    "cpu": {"bnb": 0.35, "torchao": 0.5, "quanto": 0.4},
}


# torchao's weight-only configurations. int4: the tinygemm layout, the one that needs no package beyond torch
# (the default "plain" layout needs mslk-cuda).
_TORCHAO_CONFIGS = {
    "int8": Call("torchao.quantization.Int8WeightOnlyConfig"),
    "int4": Call("torchao.quantization.Int4WeightOnlyConfig", {"int4_packing_format": "tile_packed_to_4d"}),
    "fp8": Call("torchao.quantization.Float8WeightOnlyConfig"),
}


declare_recipe(
    Recipe(
        "memory",
        "4-bit NF4 weights, bf16 compute",
        (
            ("quantization", ("bnb-4bit", "torchao-int4", "quanto-int4", "bnb-8bit")),
            ("dtype", ("bfloat16", "float16")),
        ),
        "the guides' way to fit a model: about a quarter of the weight memory (gpu-one, overview)",
    )
)
