"""The decoding loop between two tokens: generate()'s own, or one of autotune's through transformers'
`generate(custom_generate=...)` (autotune/worker/decode_loops.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from autotune.space.knobs.base import NEUTRAL, DeviceType, Expectation, Knob, Needs, Target, Value, register
from autotune.space.plan import Plan

STOCK_LOOP = "generate"


@register
class DecodeLoopKnob(Knob):
    name = "decode_loop"
    help = (
        "the loop between tokens: generate (transformers' own), deferred-stop (its steps, the stop read every few "
        "tokens instead of after each), fused-step (one compiled call per token, inputs prepared once, the stop "
        "read late), through generate(custom_generate=...)"
    )
    short_name = "loop"
    choices = (STOCK_LOOP, "deferred-stop", "fused-step")
    default = STOCK_LOOP
    failure_words = ("decode loop", "custom_generate")
    needs: ClassVar[Mapping[Value, Needs]] = {
        "deferred-stop": Needs(
            device_runs_ahead=True,
            why="the stop read late lets the host queue steps ahead of a GPU, but a CPU runs each step before the "
            "host goes on (measured: docs/knobs.md, decode_loop)",
        )
    }

    def expect(self, value: Value, device: DeviceType) -> Expectation:
        """Against generate()'s loop. On a CPU the fused step took a compiled step from 0.65x-0.74x of the hand loop's
        speed to 0.95x-0.97x, and an uncompiled one 1.01x-1.04x faster [loops]. On GPUs generate() left about 1.4 ms
        per token outside the compiled step [headroom], which the fused step removes most of and the late stop lets
        the host overlap with the device: not measured there yet, so less sure."""
        if value == "fused-step":
            return Expectation(speed=1.3, spread=0.45) if device == "cuda" else Expectation(speed=1.15, spread=0.3)
        if value == "deferred-stop" and device == "cuda":
            return Expectation(speed=1.1, spread=0.3)
        return NEUTRAL

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if value == STOCK_LOOP:
            return
        plan.decode_loop = str(value)
        plan.not_servable.append(f"decode_loop={value} (serve runs its own decoding loop)")
