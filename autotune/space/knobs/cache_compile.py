"""KV cache and compilation knobs: the cache implementation, how a quantized cache quantizes, and torch.compile of
the decoding step (which a static cache makes possible)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from autotune.space.knobs.base import (
    FLASH,
    NEUTRAL,
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
from autotune.space.plan import Call, Plan


@register
class CacheKnob(Knob):
    name = "cache_implementation"
    help = "KV cache of generate(); quantized stores keys and values quantized, by the kv_cache_backend"
    short_name = "cache"
    choices = ("dynamic", "static", "offloaded", "offloaded_static", "quantized")
    default = "dynamic"
    failure_words = ("cache", "quanto", "hqq", "offload")
    needs: ClassVar[Mapping[Value, Needs]] = dict.fromkeys(
        ("offloaded", "offloaded_static"), Needs(cuda=True, why="offloaded caches move layers between GPU and CPU")
    )

    def expect(self, value: Value, device: DeviceType) -> Expectation:
        """Against dynamic. A static cache alone is not compiled here (disable_compile): the compile knob says what
        compiling it brings."""
        if value == "static":
            return Expectation(memory=1.05, spread=0.2)  # allocated for the longest sequence up front
        if str(value).startswith("offloaded"):
            return Expectation(speed=0.9, memory=0.9, spread=0.25)  # [h100: 0.98x at 1.1B]; KV on the host [overview]
        if value == "quantized":
            return Expectation(speed=0.7, memory=0.95, kl=1e-3)  # KV quantized and dequantized per step [cpu]
        return NEUTRAL

    def depends_on_version(self, value: Value) -> bool:
        """A quantized cache runs generate()'s default KV backend (quanto), which each version picks and calls."""
        return value == "quantized" or super().depends_on_version(value)

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if value == "dynamic":
            return
        plan.generate["cache_implementation"] = value
        if value in COMPILEABLE_CACHES:
            # generate() compiles a static cache by itself on a GPU; the compile knob turns this back on.
            plan.generate["disable_compile"] = True
        if value != "static":
            plan.not_servable.append(f"cache_implementation={value}")


COMPILEABLE_CACHES = ("static", "offloaded_static")


@register
class KvCacheBackendKnob(Knob):
    name = "kv_cache_backend"
    help = "how the quantized KV cache quantizes: fp8 per tensor, or 4-bit groups with optimum-quanto or hqq"
    short_name = "kv"
    choices = ("fp8", "quanto", "hqq")
    default = "quanto"  # what generate() picks for cache_implementation="quantized" without a cache_config
    after = ("cache_implementation",)  # configures the quantized cache only
    # transformers' messages about a backend it lacks, or whose package is missing
    refusals = ("kv cache quantization", "quantization backend", "kv-cache backend")
    memory_ranks: ClassVar[dict[Value, int]] = {"fp8": 1, "quanto": 0, "hqq": 0}
    requires: ClassVar[Mapping[Value, Requires]] = {
        "fp8": Requires("transformers", since="5.22", what="fp8 KV-cache backend"),
        "quanto": Requires("optimum-quanto", "optimum.quanto", extra="quant"),
        "hqq": Requires("hqq", extra="quant"),
    }

    def expect(self, value: Value, device: DeviceType) -> Expectation:
        """Against quanto (generate()'s default backend)."""
        if value == "fp8":
            return Expectation(speed=1.3, memory=1.02, kl=-5e-4)  # 8 bits per tensor: lighter work, closer [cpu]
        return NEUTRAL

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if not plan.quantized_kv_cache:
            return
        # fp8 refuses the group-wise options; the others keep transformers' residual_length (128 tokens in
        # full precision) and group size, with its default 4 bits written out.
        plan.generate["cache_config"] = {"backend": value} if value == "fp8" else {"backend": value, "nbits": 4}


_CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


@register
class CompileKnob(Knob):
    name = "compile"
    help = "torch.compile of the decoding step, through generate()'s compile_config"
    choices = ("off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    default = "off"
    after = ("cache_implementation",)  # undoes its disable_compile; a static cache left uncompiled is not servable
    failure_words = ("compile", "inductor", "dynamo", "triton")

    def expect(self, value: Value, device: DeviceType) -> Expectation:
        """Against a static cache not compiled. Static cache + torch.compile: "up to a 4x speed up", less for larger
        models [optims]; reduce-overhead (CUDA graphs) is the mode the guides name [perf], and generate()'s auto-compile
        in that mode measured 8.1x at 1.1B [h100]. Compiling takes the first call: the slowest trials. A trial's time
        beyond a plain one's is mostly the compile: max-autotune's (7) is 3.5x reduce-overhead's (2), the larger of the
        ratios seen [h200] (strategy/durations.py scales a measured compile by it)."""
        if value == "off":
            return NEUTRAL
        if device == "cpu":
            # less Python overhead; no CUDA graphs [overview]. A compiled trial took 1.7x-4.6x a plain one, 3.4x at the
            # median, on the CPU grids [cpu]
            return Expectation(speed=1.5, time=3.5, spread=0.5)
        if value in _CUDA_GRAPH_MODES:
            time = 8.0 if value == "max-autotune" else 3.0
            return Expectation(speed=4.0, memory=1.1, time=time, spread=0.6)
        return Expectation(speed=2.0, time=3.0 if value == "default" else 8.0, spread=0.6)  # no-cudagraphs autotunes

    needs: ClassVar[Mapping[Value, Needs]] = {
        mode: Needs(cuda=True, why=f"compile mode {mode} captures CUDA graphs") for mode in _CUDA_GRAPH_MODES
    }

    def duration_group(self, value: Value | None) -> object:
        return False if value in (None, "off") else value  # each mode compiles for its own time

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if value == "off":
            if plan.generate.get("cache_implementation") == "static":
                plan.not_servable.append("a static cache without compilation (serve --compile compiles it)")
            return
        plan.generate.pop("disable_compile", None)
        # generate() compiles on CUDA only unless this private switch is set.
        attrs = {"_compile_all_devices": True} if target.device_type == "cpu" else {}
        plan.generate["compile_config"] = Call("transformers.CompileConfig", {"mode": value}, attrs)
        plan.serve_flags.append("--compile")
        if value != "reduce-overhead":
            plan.not_servable.append(f"compile mode {value} (serve --compile uses its default)")


declare_recipe(
    Recipe(
        "throughput",
        "bf16 + static cache + torch.compile",
        (
            ("dtype", ("bfloat16", "float16")),
            ("attn_implementation", (FLASH,)),
            ("cache_implementation", ("static",)),
            ("compile", ("reduce-overhead", "default")),
        ),
        "the guides' first recipe for decode speed, up to 4x (llm_optims); bf16 on Ampere and newer (perf)",
        gpu_only=frozenset({"dtype", "attn_implementation"}),
    )
)
declare_recipe(
    Recipe(
        "latency",
        "compiled static cache, one prompt at a time",
        (
            ("dtype", ("bfloat16", "float16")),
            ("cache_implementation", ("static",)),
            ("compile", ("reduce-overhead", "default")),
        ),
        "static cache + torch.compile for per-token latency (llm_optims, perf)",
        gpu_only=frozenset({"dtype"}),
    )
)
