"""Precision knobs: the dtype the weights load in, and the internal precision of float32 matmuls."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from autotune.space.knobs.base import DeviceType, Expectation, Knob, Needs, Requires, Target, Value, register
from autotune.space.plan import Call, Plan, Ref


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

    def expect(self, value: Value, device: DeviceType) -> Expectation:
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


@register
class Fp32PrecisionKnob(Knob):
    name = "fp32_precision"
    help = (
        "internal precision of float32 matmuls and convolutions, generate() inside torch.backends.flags(): "
        "ieee keeps float32; tf32 runs TensorFloat-32 tensor cores (Ampere or newer GPUs); bf16 lets oneDNN "
        "compute in bfloat16 on CPUs where it does (a probe asks this one; where it does not, bf16 is not searched)"
    )
    short_name = "fp32"
    choices = ("ieee", "tf32", "bf16")
    default = "ieee"  # float32 computed as float32: what torch does unless told otherwise
    failure_words = ("tf32", "fp32_precision", "matmul precision")
    needs: ClassVar[Mapping[Value, Needs]] = {
        "tf32": Needs(cuda=True, min_compute_capability=8.0, why="TensorFloat-32 needs an Ampere or newer GPU"),
        "bf16": Needs(
            bf16_matmuls=True,
            why="bfloat16 is never used on this CPU: oneDNN keeps float32 matmuls in float32 under it (the probe's "
            "matmuls came out exact, autotune/worker/fpmath.py), so its trials would compute as ieee's do",
        ),
    }
    requires: ClassVar[Mapping[Value, Requires]] = dict.fromkeys(
        ("tf32", "bf16"), Requires("torch", since="2.9", what="fp32_precision setting of torch.backends.flags")
    )

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if value == "ieee":
            return
        plan.contexts.append(Call("torch.backends.flags", {"fp32_precision": value}))
        plan.not_servable.append(f"fp32_precision={value} (serve sets no float32 precision)")
