"""Attention knobs: the attention implementation (a hub kernel included), and the kernel behind sdpa."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import ClassVar

from autotune.space.knobs.base import NEUTRAL, DeviceType, Expectation, Knob, Needs, Target, Value, register
from autotune.space.plan import Call, Plan, Ref

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

    def expect(self, value: Value, device: DeviceType) -> Expectation:
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

    def depends_on_version(self, value: Value) -> bool:
        """A hub kernel comes through the kernels package, which each transformers pins."""
        return "/" in str(value) or super().depends_on_version(value)

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

    def expect(self, value: Value, device: DeviceType) -> Expectation:
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
