"""One handler per knob: which values it takes, what they need to run, and what they do to a plan.

Adding a knob means one handler here and one entry in the search-space YAML (docs/adding-a-knob.md).
What a value needs (hardware, packages, a workload) is data on its handler; autotune/space/rules.py is
the one module that reads it and decides what can run where.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from autotune.space.plan import Call, Plan, Ref
from autotune.specs import WorkloadKind

DeviceType = Literal["cpu", "cuda"]
Value = str | int


@dataclass(frozen=True)
class Needs:
    """What a knob value needs from the hardware (checked against the profile before the study starts)."""

    cuda: bool = False
    min_compute_capability: float | None = None
    below_compute_capability: float | None = None
    gpus: int = 1  # how many GPUs of the profile's kind it runs on (tensor parallelism)
    why: str = ""


@dataclass(frozen=True)
class Expectation:
    """What the guides lead one to expect of a knob value on one device kind, against the knob's transformers
    default (or, for a knob whose default depends on the model, against a fixed value the handler names).

    A prior, not a figure: what a trial measures always wins over it. Factors multiply; `kl` adds.
    """

    speed: float = 1.0  # decode tokens/s (per-token and first-token latency divide by it)
    memory: float = 1.0  # peak memory
    kl: float = 0.0  # nats/token added to the divergence from the most precise reference
    time: float = 1.0  # the trial's duration (loading, first call or compile, measuring) against a plain trial
    spread: float = 0.35  # how unsure: the standard deviation of ln(speed) and ln(memory) around the factors


NEUTRAL = Expectation(spread=0.2)
DeviceKind = DeviceType


@dataclass(frozen=True)
class Requires:
    """A package a knob value needs in the trial's environment, from a version on.

    Its presence is checked before the study (the value is not searched where it is missing, with the extra
    that installs it), its version by the trial worker (autotune/space/rules.py).
    """

    package: str  # its pip name
    module: str = ""  # its import name, where it differs (optimum-quanto: optimum.quanto)
    since: str | None = None  # the first version with what the value needs; None: any version
    what: str = ""  # what that version brought, for the message: "fp8 KV-cache backend"
    extra: str | None = None  # the extra of `pip install autotune[...]` that installs it; None: a core dependency

    @property
    def import_name(self) -> str:
        return self.module or self.package


@dataclass(frozen=True)
class Refusal:
    """Values a workload could only see refused, so a search for that workload never plans them."""

    values: tuple[Value, ...]
    most_requests: int  # refused when the workload runs more requests at once
    why: str


@dataclass(frozen=True)
class Target:
    """What the plan is built for: the device, and the workload's largest shape (it sizes the paged cache)."""

    device_type: DeviceType
    requests: int = 8
    tokens_per_request: int = 192  # prompt + generated tokens
    workload: WorkloadKind = "throughput"  # the study's; a workload knob in the space overrides it
    assistant_model: str | None = None  # the draft model speculative=assistant loads (--assistant-model)


class Knob:
    """A knob's handler: everything the rest of autotune needs to know about the knob is said here."""

    name: ClassVar[str]
    help: ClassVar[str]
    short_name: ClassVar[str] = ""  # in one-line tables; the name itself when empty
    choices: ClassVar[tuple[Value, ...] | None] = None  # None: accepts() decides
    # What from_pretrained + generate do with no argument, the baseline's value; None: it depends on
    # the model (the checkpoint's dtype, the attention transformers picks) or has no fixed value.
    default: ClassVar[Value | None] = None
    # Words of a failure message (missing package, refusal) that point at this knob when it is set
    # to a value other than a usual one: they make the value suspected (worker/failures.py).
    failure_words: ClassVar[tuple[str, ...]] = ()
    # Sentences transformers refuses this knob with: they blame it whatever its value (even the default).
    refusals: ClassVar[tuple[str, ...]] = ()
    # Values ordered by the memory they need, all else equal (higher needs more); empty: not ordered.
    memory_ranks: ClassVar[dict[Value, int]] = {}
    # The knobs whose part of the plan this one reads or changes: they are applied first (build_order).
    after: ClassVar[tuple[str, ...]] = ()
    # What its values need to run, read by autotune/space/rules.py; values not named need nothing.
    needs: ClassVar[Mapping[Value, Needs]] = {}  # hardware
    unlisted_values_need: ClassVar[Needs | None] = None  # hardware of accepted values beyond `choices`
    requires: ClassVar[Mapping[Value, Requires]] = {}  # packages and versions
    refused: ClassVar[tuple[Refusal, ...]] = ()  # workloads that could only refuse them

    @property
    def label(self) -> str:
        return self.short_name or self.name

    def memory_rank(self, value: Value) -> int | None:
        """Orders the memory a value needs, all else equal (higher needs more); None: not ordered."""
        return self.memory_ranks.get(value)

    def orders_memory(self) -> bool:
        return bool(self.memory_ranks)

    def expect(self, value: Value, device: DeviceKind) -> Expectation:
        """What the guides lead one to expect of this value on this device kind (a prior; see Expectation)."""
        return NEUTRAL

    def duration_group(self, value: Value | None) -> object:
        """Trials whose knobs give the same groups take about as long; None for knobs that do not matter.

        `value` is None when the configuration leaves the knob out.
        """
        return None

    def accepts(self, value: Value) -> bool:
        return self.choices is not None and value in self.choices

    def describe_values(self) -> str:
        return ", ".join(str(choice) for choice in self.choices or ())

    def usual_values(self) -> tuple[Value, ...]:
        """Values a failure message may name without being about this knob: its default, or what it may be
        without being set (a checkpoint's dtype, the attention transformers picks, the study's workload)."""
        return (self.default,) if self.default is not None else ()

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        raise NotImplementedError


KNOBS: dict[str, Knob] = {}


def register(cls: type[Knob]) -> type[Knob]:
    KNOBS[cls.name] = cls()
    return cls


def knob_defaults() -> dict[str, Value]:
    """Every knob's transformers default, where it has one that does not depend on the model."""
    return {name: knob.default for name, knob in KNOBS.items() if knob.default is not None}


def short_name(name: str) -> str:
    return KNOBS[name].label if name in KNOBS else name


def build_order(knobs: dict[str, Knob]) -> list[str]:
    """The knobs in the order they build a plan: each after the knobs it names in `after`, otherwise as registered.

    A knob that names an unknown knob, or knobs that wait for each other, are an error (raised at import).
    """
    for name, knob in knobs.items():
        unknown = [other for other in knob.after if other not in knobs]
        if unknown:
            raise ValueError(f"knob {name} is applied after {', '.join(unknown)}, which is no registered knob")
    order: list[str] = []
    waiting = dict(knobs)
    while waiting:
        ready = next((name for name, knob in waiting.items() if all(o not in waiting for o in knob.after)), None)
        if ready is None:
            raise ValueError(f"knobs {', '.join(waiting)} are each applied after another of them: a cycle")
        order.append(ready)
        del waiting[ready]
    return order


def build_plan(config: dict[str, Value], target: Target) -> Plan:
    """Apply the knobs of a configuration, in build order, to a plan of the target's workload."""
    plan = Plan(workload=target.workload)
    for name in _current_build_order(tuple((name, knob.after) for name, knob in KNOBS.items())):
        if name in config:
            KNOBS[name].apply(config[name], plan, target)
    return plan


@functools.lru_cache(maxsize=8)
def _current_build_order(registered: tuple[tuple[str, tuple[str, ...]], ...]) -> tuple[str, ...]:
    """build_order of the registry as it is now, keyed by its knobs and their `after` (tests reorder the registry)."""
    return tuple(build_order(KNOBS))


# Where the expectations (Knob.expect) come from, named in their comments:
# [overview]  transformers docs, optimization_overview.md: the techniques and what each does for speed and memory
# [perf]      transformers' performance guide (shared/seeds/001): triage ladder, mixed precision "large speed/memory
#             wins on GPUs", compile with mode="reduce-overhead", bitsandbytes to make a model fit
# [gpu-one]   perf_infer_gpu_one.md: FlashAttention-2, LLM.int8 halves nn.Linear in fp16/bf16, 4-bit loading
# [optims]    llm_optims.md: static cache + torch.compile "up to a 4x speed up" (less for larger models), speculative
#             decoding, half-precision and 8-bit weight memory
# [serving]   transformers serve optimizations: continuous batching for throughput, compile incompatible with it
# [h100]      autotune's one H100 run (shared/notes/api-facts.md, a 1.1B Llama at batch 8): bnb-8bit 0.25x, bnb-4bit
#             0.75x, flex_attention 0.88x, offloaded cache 0.98x the bf16 baseline; eager decode launch-bound
# [h200]      reports/gpu/2026-11-26-h200 (a 1.1B Llama at batch 8): compile reduce-overhead's first call 21 s (its
#             trial 2.3x a plain one), max-autotune's 74 s: 3.5x (issue 39's 1.5B model: 36-42 s and 75 s, about 2x)
# [cpu]       benchmarks/results/techniques-cpu.md and the CPU grids (benchmarks/results/grid-demo-cpu*.json)


@register
class DtypeKnob(Knob):
    name = "dtype"
    help = "precision the weights are loaded in"
    choices = ("float32", "bfloat16", "float16")
    by_precision = ("float32", "bfloat16", "float16")  # most precise first: the reference takes the first that runs
    memory_ranks: ClassVar[dict[Value, int]] = {"float32": 2, "bfloat16": 1, "float16": 1}
    needs: ClassVar[Mapping[Value, Needs]] = {
        "bfloat16": Needs(min_compute_capability=8.0, why="bfloat16 needs compute capability 8.0 (Ampere) or newer")
    }

    def expect(self, value: Value, device: DeviceKind) -> Expectation:
        """Against float32 (the default depends on the checkpoint)."""
        if value == "float32":
            return Expectation(spread=0.2)
        # half the weight bytes [optims]; KL as measured on the demo model (docs/usage.md, Objectives)
        kl = 1e-4 if value == "bfloat16" else 2e-5
        if device == "cuda":
            return Expectation(speed=1.8, memory=0.55, kl=kl)  # "large speed/memory wins on GPUs" [perf]
        return Expectation(speed=1.0, memory=0.6, kl=kl)  # no tensor cores: about as fast [cpu]

    def usual_values(self) -> tuple[Value, ...]:
        return self.by_precision  # any of them may be the checkpoint's

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        plan.load["dtype"] = Ref(f"torch.{value}")
        plan.serve_flags += ["--dtype", str(value)]


_HUB_KERNEL = re.compile(r"^[\w.-]+/[\w.-]+(@[\w.-]+)?(:[\w.-]+)?$")


@register
class AttentionKnob(Knob):
    name = "attn_implementation"
    help = "attention backend; a hub kernel is written <namespace>/<repo>[@revision][:name]"
    short_name = "attn"
    choices = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4")
    failure_words = ("flash", "attention", "attn", "kernels")
    # What from_pretrained says when an architecture refuses an attention backend (sdpa, flex, flash).
    refusals = ("does not support an attention implementation",)

    def accepts(self, value: Value) -> bool:
        return value in self.choices or (isinstance(value, str) and bool(_HUB_KERNEL.match(value)))

    needs: ClassVar[Mapping[Value, Needs]] = {
        "flash_attention_2": Needs(
            cuda=True, min_compute_capability=8.0, why="flash_attention_2 needs an Ampere or newer GPU"
        ),
        "flash_attention_3": Needs(
            cuda=True,
            min_compute_capability=9.0,
            below_compute_capability=10.0,
            why="flash_attention_3 runs on Hopper GPUs only",
        ),
        "flash_attention_4": Needs(
            cuda=True, min_compute_capability=9.0, why="flash_attention_4 needs Hopper or Blackwell"
        ),
    }
    unlisted_values_need = Needs(cuda=True, why="hub attention kernels are CUDA kernels")

    def describe_values(self) -> str:
        return super().describe_values() + ", or a hub kernel such as kernels-community/flash-attn2"

    def expect(self, value: Value, device: DeviceKind) -> Expectation:
        """Against sdpa (transformers' pick for most architectures)."""
        if device == "cpu":
            if value == "flex_attention":
                return Expectation(speed=0.7, time=2.5)  # compiles its kernel on the first call [cpu]
            return NEUTRAL
        if value == "eager":
            return Expectation(speed=0.95, memory=1.05, spread=0.2)  # sdpa fuses attention [gpu-one]
        if value == "flex_attention":
            return Expectation(speed=0.88, time=1.5)  # [h100]
        if str(value).startswith("flash_attention") or "/" in str(value):
            return Expectation(speed=1.1, memory=0.95)  # fewer memory reads and writes [gpu-one, optims]
        return NEUTRAL

    def usual_values(self) -> tuple[Value, ...]:
        return ("sdpa", "eager")  # what transformers picks when none is given

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        plan.load["attn_implementation"] = value
        plan.serve_flags += ["--attn-implementation", str(value)]


@register
class SdpaBackendKnob(Knob):
    name = "sdpa_backend"
    help = "the kernel behind sdpa attention: auto (torch picks per call), or one forced with sdpa_kernel"
    choices = ("auto", "flash", "efficient", "cudnn", "math")
    default = "auto"
    needs: ClassVar[Mapping[Value, Needs]] = {
        # torch has a CPU flash kernel too; on CUDA it is built for Ampere and up
        "flash": Needs(min_compute_capability=8.0, why="torch's flash sdpa kernel needs an Ampere or newer GPU"),
        "cudnn": Needs(cuda=True, min_compute_capability=8.0, why="the cudnn sdpa kernel needs an Ampere or newer GPU"),
        "efficient": Needs(cuda=True, why="the efficient sdpa kernel is a CUDA kernel"),
    }

    def expect(self, value: Value, device: DeviceKind) -> Expectation:
        """Against auto (torch picks the kernel per call)."""
        if value == "math":
            return Expectation(speed=0.75, memory=1.1)  # the unfused reference kernel [cpu]
        if value == "cudnn" and device == "cuda":
            return Expectation(speed=1.05, spread=0.2)
        return NEUTRAL

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if value == "auto":
            return
        backend = Ref(f"torch.nn.attention.SDPBackend.{_SDPA_BACKENDS[str(value)]}")
        plan.contexts.append(Call("torch.nn.attention.sdpa_kernel", {"backends": backend}))
        plan.not_servable.append(f"sdpa_backend={value} (serve lets torch pick the sdpa kernel)")


_SDPA_BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}


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

    def expect(self, value: Value, device: DeviceKind) -> Expectation:
        """Against none. Memory: the weights in 8 bits are about half of bf16's, in 4 bits about a quarter
        [gpu-one, optims], the rest of the peak unchanged. None is expected to be faster [h100, cpu]."""
        if value == "none":
            return Expectation(spread=0.2)
        backend, _, kind = str(value).partition("-")
        memory, kl = (0.35, 1e-2) if "4" in kind else (0.55, 1e-3)  # 4bit, int4
        speed = _QUANTIZED_SPEED[device].get(backend, 0.5)
        # Quantizing while loading takes time. quanto-int4 on a CPU: still warming up after 34 s where a plain trial
        # took 4 s (the 3-minute demo search, 2026-11-25); int8 weights took about a plain trial's time [cpu].
        time = 10.0 if (value == "quanto-int4" and device == "cpu") else 1.3
        return Expectation(speed=speed, memory=memory, kl=kl, time=time)

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if value == "none":
            return
        backend, _, kind = str(value).partition("-")
        if backend == "bnb":
            plan.load["quantization_config"] = _bitsandbytes_config(kind, plan)
            plan.serve_flags += ["--quantization", str(value)]
            return
        if backend == "torchao":
            config = Call("transformers.TorchAoConfig", {"quant_type": _TORCHAO_CONFIGS[kind]})
        else:
            config = Call("transformers.QuantoConfig", {"weights": kind})
        plan.load["quantization_config"] = config
        plan.not_servable.append(f"quantization={value} (serve --quantization takes bnb-4bit or bnb-8bit only)")


def _bitsandbytes_config(kind: str, plan: Plan) -> Call:
    if kind == "8bit":
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


@register
class UseKernelsKnob(Knob):
    name = "use_kernels"
    help = "hub kernels (the kernels package) for the layers transformers maps to one, e.g. RMSNorm on CUDA"
    short_name = "kernels"
    choices = ("off", "on")
    default = "off"

    def expect(self, value: Value, device: DeviceKind) -> Expectation:
        if value == "on" and device == "cuda":
            return Expectation(speed=1.05, spread=0.2)  # fused kernels for mapped layers [overview]
        return NEUTRAL

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if value == "off":
            return
        plan.load["use_kernels"] = True
        plan.not_servable.append("use_kernels=on (serve loads the model without hub kernels)")


@register
class TpSizeKnob(Knob):
    name = "tp_size"
    help = "tensor parallelism: the model sharded over this many ranks (torchrun), from_pretrained(tp_plan='auto')"
    short_name = "tp"
    choices = (1, 2, 4, 8)
    default = 1

    def expect(self, value: Value, device: DeviceKind) -> Expectation:
        if int(value) == 1:
            return NEUTRAL
        # One process per rank, each loading its shard; on CPU the ranks share the host's cores [cpu].
        speed = 1.3 if device == "cuda" else 0.5
        return Expectation(speed=speed, memory=1 / int(value) ** 0.5, time=2.0)  # "more memory ... sharding" [overview]

    needs: ClassVar[Mapping[Value, Needs]] = {
        ranks: Needs(gpus=ranks, why=f"tp_size={ranks} runs one rank per GPU") for ranks in (2, 4, 8)
    }

    def duration_group(self, value: Value | None) -> object:
        return value

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if int(value) == 1:
            return
        plan.load["distributed_config"] = Call("transformers.DistributedConfig", {"tp_size": value, "tp_plan": "auto"})
        plan.not_servable.append(f"tp_size={value} (serve has no tensor-parallel flag)")


@register
class BatchingKnob(Knob):
    name = "batching"
    help = "generate(): one padded batch; continuous: generate_batch() with a paged cache"
    choices = ("generate", "continuous")
    default = "generate"

    def expect(self, value: Value, device: DeviceKind) -> Expectation:
        if value != "continuous":
            return NEUTRAL
        # "maximizes throughput by keeping the GPU busy" [overview, serving]; on CPU generate_batch ran slower [cpu]
        return Expectation(speed=1.2 if device == "cuda" else 0.6, time=1.3)

    def duration_group(self, value: Value | None) -> object:
        return value

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        plan.batching = "continuous" if value == "continuous" else "generate"
        if value != "continuous":
            return
        # Keep the attention backend the trial asked for instead of switching to flash.
        plan.continuous["auto_switch_to_flash"] = False
        plan.serve_flags.append("--continuous-batching")
        size_paged_cache(plan, target, PAGE_SIZE)


PAGE_SIZE = 32  # tokens per page of the paged KV cache, unless the page_size knob says otherwise
SPARE_PAGES = 2


def size_paged_cache(plan: Plan, target: Target, page_size: int) -> None:
    """Size the paged cache for the workload's requests at this page size.

    Unsized, it takes ~90% of free GPU memory (or sizes from RAM on CPU), and peak memory would say nothing.
    """
    pages_per_request = -(-target.tokens_per_request // page_size)
    num_blocks = target.requests * pages_per_request + SPARE_PAGES
    plan.continuous |= {"page_size": page_size, "num_blocks": num_blocks, "max_requests_per_batch": target.requests}
    _set_flag(plan.serve_flags, "--cb-block-size", str(page_size))
    _set_flag(plan.serve_flags, "--cb-num-blocks", str(num_blocks))


def _set_flag(flags: list[str], flag: str, value: str) -> None:
    if flag in flags:
        flags[flags.index(flag) + 1] = value
    else:
        flags += [flag, value]


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

    def expect(self, value: Value, device: DeviceKind) -> Expectation:
        """Against dynamic. A static cache alone is not compiled here (disable_compile): the compile knob says what
        compiling it brings."""
        if value == "static":
            return Expectation(memory=1.05, spread=0.2)  # allocated for the longest sequence up front
        if str(value).startswith("offloaded"):
            return Expectation(speed=0.9, memory=0.9, spread=0.25)  # [h100: 0.98x at 1.1B]; KV on the host [overview]
        if value == "quantized":
            return Expectation(speed=0.7, memory=0.95, kl=1e-3)  # KV quantized and dequantized per step [cpu]
        return NEUTRAL

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

    def expect(self, value: Value, device: DeviceKind) -> Expectation:
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

    def expect(self, value: Value, device: DeviceKind) -> Expectation:
        """Against a static cache not compiled. Static cache + torch.compile: "up to a 4x speed up", less for larger
        models [optims]; reduce-overhead (CUDA graphs) is the mode the guides name [perf], and generate()'s auto-compile
        in that mode measured 8.1x at 1.1B [h100]. Compiling takes the first call: the slowest trials. A trial's time
        beyond a plain one's is mostly the compile: max-autotune's (7) is 3.5x reduce-overhead's (2), the larger of the
        ratios seen [h200] (search/durations.py scales a measured compile by it)."""
        if value == "off":
            return NEUTRAL
        if device == "cpu":
            # less Python overhead; no CUDA graphs [overview]. A compiled trial took 1.7x-4.6x a plain one, 3.4x at the
            # median, on the CPU grids [cpu]
            return Expectation(speed=1.5, time=3.5, spread=0.5)
        if value in _CUDA_GRAPH_MODES:
            time = 8.0 if value == "max-autotune" else 3.0
            return Expectation(speed=4.0, memory=1.1, time=time, spread=0.6)
        return Expectation(
            speed=2.0, time=3.0 if value == "default" else 8.0, spread=0.6
        )  # no-cudagraphs autotunes too

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


class _WholeNumberKnob(Knob):
    """A knob that takes any whole number in a range, rather than a list of choices."""

    minimum: ClassVar[int] = 1
    maximum: ClassVar[int | None] = None
    counts: ClassVar[str] = ""  # what the number counts, for messages

    def accepts(self, value: Value) -> bool:
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        return value >= self.minimum and (self.maximum is None or value <= self.maximum)

    def describe_values(self) -> str:
        upper = f" to {self.maximum}" if self.maximum is not None else ""
        counts = f" ({self.counts})" if self.counts else ""
        return f"a whole number from {self.minimum}{upper}{counts}"


@register
class MaxBatchTokensKnob(_WholeNumberKnob):
    name = "max_batch_tokens"
    help = "tokens per forward pass under continuous batching"
    counts = "tokens per forward pass"

    def memory_rank(self, value: Value) -> int | None:
        return int(value)  # more tokens per forward pass, larger activations

    def orders_memory(self) -> bool:
        return True

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        plan.continuous["max_batch_tokens"] = value
        plan.serve_flags += ["--cb-max-batch-tokens", str(value)]


@register
class PageSizeKnob(_WholeNumberKnob):
    name = "page_size"
    help = (
        "tokens per page of the paged KV cache under continuous batching (32 when unset); "
        "the number of pages still comes from the workload"
    )
    short_name = "page"
    after = ("batching",)  # resizes the paged cache batching sized with the default page
    # transformers' own default (256) is never run: autotune always sizes the cache from the workload.
    default = None
    minimum = 4  # transformers refuses smaller pages (5.17 and 5.22)
    counts = "tokens per page"

    def memory_rank(self, value: Value) -> int | None:
        return int(value)  # a request's last page is partly empty: larger pages waste more

    def orders_memory(self) -> bool:
        return True

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        size_paged_cache(plan, target, int(value))


class _AutoOnOffKnob(Knob):
    """A ContinuousBatchingConfig switch of its own name: auto lets transformers decide, on and off force it."""

    choices = ("auto", "on", "off")
    default = "auto"
    # auto turns out as on or off: no lighter than off, no heavier than on.
    memory_ranks: ClassVar[dict[Value, int]] = {"off": 0, "auto": 1, "on": 2}
    serve_switch: ClassVar[tuple[str, str] | None] = None  # serve's (on, off) flags; None: it has none
    speed_on_cuda: ClassVar[float] = 1.0  # what forcing it on is expected to bring on CUDA, against auto

    def expect(self, value: Value, device: DeviceKind) -> Expectation:
        if device != "cuda" or value == "auto":
            return NEUTRAL
        return Expectation(speed=self.speed_on_cuda if value == "on" else 1.0, spread=0.25)

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if value == "auto":
            return
        plan.continuous[self.name] = value == "on"
        if self.serve_switch:
            plan.serve_flags.append(self.serve_switch[0 if value == "on" else 1])
        else:
            plan.not_servable.append(f"{self.name}={value} (serve has no flag for it)")


@register
class CudaGraphKnob(_AutoOnOffKnob):
    name = "use_cuda_graph"
    help = (
        "CUDA graphs of continuous batching's forward passes; auto: transformers turns them on only for "
        "attention that needs no mask (flash)"
    )
    short_name = "cuda_graph"
    failure_words = ("graph",)
    speed_on_cuda = 1.3  # no kernel-launch overhead per forward pass, as compile's CUDA-graph modes [perf]
    needs: ClassVar[Mapping[Value, Needs]] = {
        "on": Needs(cuda=True, why="CUDA graphs need CUDA: elsewhere transformers turns them off, a no-op"),
        "off": Needs(cuda=True, why="off differs from auto only on CUDA: elsewhere graphs are never used"),
    }
    serve_switch = ("--cb-use-cuda-graph", "--no-cb-use-cuda-graph")


@register
class AsyncBatchingKnob(_AutoOnOffKnob):
    name = "use_async_batching"
    help = (
        "continuous batching prepares the next batch while the GPU runs this one (twice the batch buffers); "
        "auto: transformers turns it on with CUDA graphs and flash attention"
    )
    short_name = "async"
    failure_words = ("async",)
    speed_on_cuda = 1.1  # the next batch prepared while this one runs
    needs: ClassVar[Mapping[Value, Needs]] = {
        "on": Needs(cuda=True, why="async batching needs a CUDA or XPU device: transformers refuses it elsewhere"),
        "off": Needs(cuda=True, why="off differs from auto only on CUDA: elsewhere async batching is never used"),
    }


@register
class ExecutionModeKnob(Knob):
    name = "execution_mode"
    help = "no_grad: generate() as it is (it runs under torch.no_grad); inference_mode: inside torch.inference_mode()"
    choices = ("no_grad", "inference_mode")
    default = "no_grad"  # generate() as it is

    def expect(self, value: Value, device: DeviceKind) -> Expectation:
        if value == "inference_mode":
            return Expectation(speed=1.05, spread=0.15)  # 5-17% on CPU (api-facts, optimum-benchmark) [perf]
        return NEUTRAL

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if value == "inference_mode":
            plan.contexts.append(Call("torch.inference_mode"))
            plan.not_servable.append("execution_mode=inference_mode (serve calls generate() as it is)")


@register
class Fp32PrecisionKnob(Knob):
    name = "fp32_precision"
    help = (
        "internal precision of float32 matmuls and convolutions, generate() inside torch.backends.flags(): "
        "ieee keeps float32; tf32 runs TensorFloat-32 tensor cores (Ampere or newer GPUs); bf16 lets oneDNN "
        "compute in bfloat16 (CPUs with AVX512-BF16 or AMX)"
    )
    short_name = "fp32"
    choices = ("ieee", "tf32", "bf16")
    default = "ieee"  # float32 computed as float32: what torch does unless told otherwise
    failure_words = ("tf32", "fp32_precision", "matmul precision")
    needs: ClassVar[Mapping[Value, Needs]] = {
        "tf32": Needs(cuda=True, min_compute_capability=8.0, why="TensorFloat-32 needs an Ampere or newer GPU")
    }
    requires: ClassVar[Mapping[Value, Requires]] = dict.fromkeys(
        ("tf32", "bf16"), Requires("torch", since="2.9", what="fp32_precision setting of torch.backends.flags")
    )

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if value == "ieee":
            return
        plan.contexts.append(Call("torch.backends.flags", {"fp32_precision": value}))
        plan.not_servable.append(f"fp32_precision={value} (serve sets no float32 precision)")


@register
class SpeculativeKnob(Knob):
    name = "speculative"
    help = (
        "speculative decoding in generate(): prompt_lookup (drafts copied from the prompt), assistant (a draft "
        "model, --assistant-model), early_exit (the model's own first layers draft); lossless under greedy, "
        "batch size 1 only"
    )
    short_name = "spec"
    after = ("dtype",)  # the draft model loads in the main model's dtype
    choices = ("none", "prompt_lookup", "assistant", "early_exit")
    default = "none"
    # "assisted generate is only supported for batch_size = 1": transformers' refusal of batches
    failure_words = ("assisted", "assistant", "prompt_lookup", "early_exit", "speculat")
    refused = (
        Refusal(
            values=("prompt_lookup", "assistant", "early_exit"),
            most_requests=1,
            why="transformers' assisted decoding takes one prompt at a time",
        ),
    )

    def expect(self, value: Value, device: DeviceKind) -> Expectation:
        """Lossless under greedy decoding [optims]. A draft model helps most when it is much smaller than the
        model; prompt lookup on input-grounded tasks [optims]. Both ran slower on the CPU demo [cpu]."""
        if value == "none":
            return NEUTRAL
        if device == "cpu":
            return Expectation(speed=0.6, time=1.5)
        return Expectation(speed=1.5 if value == "assistant" else 1.2, time=1.5, spread=0.5)

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if value == "none":
            return
        if value == "prompt_lookup":
            plan.generate["prompt_lookup_num_tokens"] = DEFAULT_PROMPT_LOOKUP_TOKENS
        elif value == "assistant":
            plan.generate["assistant_model"] = _assistant_model(plan, target)
        elif value == "early_exit":
            plan.generate["assistant_early_exit"] = DEFAULT_EARLY_EXIT_LAYER
        plan.not_servable.append(f"speculative={value} (serve has no flag for assisted decoding)")


DEFAULT_PROMPT_LOOKUP_TOKENS = 10  # the transformers guide's value; speculative_tokens overrides it
DEFAULT_EARLY_EXIT_LAYER = 2  # early_exit_layer overrides it


def _assistant_model(plan: Plan, target: Target) -> Call | None:
    """The draft model, loaded like the main one (dtype, device); None when none was given (unsupported)."""
    if target.assistant_model is None:
        return None
    kwargs: dict[str, Any] = {"pretrained_model_name_or_path": target.assistant_model}
    if "dtype" in plan.load:
        kwargs["dtype"] = plan.load["dtype"]
    kwargs["device_map"] = target.device_type
    return Call("transformers.AutoModelForCausalLM.from_pretrained", kwargs)


@register
class SpeculativeTokensKnob(_WholeNumberKnob):
    name = "speculative_tokens"
    help = "tokens drafted per step: prompt_lookup_num_tokens, or num_assistant_tokens for a draft model"
    short_name = "spec_tokens"
    after = ("speculative",)  # sets the drafted tokens of the speculative method chosen
    maximum = 128
    counts = "tokens drafted per step"

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if "prompt_lookup_num_tokens" in plan.generate:
            plan.generate["prompt_lookup_num_tokens"] = value
        elif "assistant_model" in plan.generate or "assistant_early_exit" in plan.generate:
            plan.generate["num_assistant_tokens"] = value


@register
class EarlyExitLayerKnob(_WholeNumberKnob):
    name = "early_exit_layer"
    help = "speculative=early_exit: the layer whose output drafts tokens (assistant_early_exit)"
    short_name = "exit_layer"
    after = ("speculative",)  # sets early_exit's layer
    counts = "a layer"

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if "assistant_early_exit" in plan.generate:
            plan.generate["assistant_early_exit"] = value


@register
class WorkloadKnob(Knob):
    name = "workload"
    help = (
        "how a trial is measured: throughput (a batch of prompts), latency (one prompt at a time), "
        "or serve (transformers serve under load)"
    )
    choices = ("throughput", "latency", "serve")

    def usual_values(self) -> tuple[Value, ...]:
        return self.choices  # the study's workload, whichever it is

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        """How the configuration is measured; what is deployed stays the same."""
        plan.workload = value  # type: ignore[assignment] - accepts() allows only WorkloadKind values


BUILD_ORDER = build_order(KNOBS)  # checked once here: an unknown name or a cycle in `after` fails at import
