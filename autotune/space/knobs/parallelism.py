"""Parallelism knobs: tensor parallelism over several GPUs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from autotune.space.knobs.base import NEUTRAL, DeviceType, Expectation, Knob, Needs, Target, Value, register
from autotune.space.plan import Call, Plan


@register
class TpSizeKnob(Knob):
    name = "tp_size"
    help = "tensor parallelism: the model sharded over this many ranks (torchrun), from_pretrained(tp_plan='auto')"
    short_name = "tp"
    choices = (1, 2, 4, 8)
    default = 1

    def expect(self, value: Value, device: DeviceType) -> Expectation:
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
