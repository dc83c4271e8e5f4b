"""The decoding loop between two tokens: generate()'s own, or one of autotune's through transformers'
`generate(custom_generate=...)` (autotune/worker/decode_loops.py, the knob's worker hook: each of its LOOPS is a value
here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from autotune.space.knobs.base import (
    NEUTRAL,
    Argument,
    Deployment,
    DeviceType,
    Expectation,
    Knob,
    Needs,
    Target,
    Value,
    register,
)
from autotune.space.plan import Plan

STOCK_LOOP = "generate"
# generate() arguments of assisted decoding: it runs a loop of its own, which a decoding loop cannot replace
ASSISTED = ("prompt_lookup_num_tokens", "assistant_model", "assistant_early_exit")


def loop_names() -> tuple[str, ...]:
    """autotune's loops: every value of decode_loop but generate()'s own."""
    return tuple(str(value) for value in DecodeLoopKnob.choices if value != STOCK_LOOP)


def default_folder(loop: str) -> str:
    """Where a deployment's code expects the folder `autotune loop` writes for `loop`, relative to where it runs."""
    return f"./autotune-{loop}"


@register
class DecodeLoopKnob(Knob):
    name = "decode_loop"
    help = (
        "the loop between tokens: generate (transformers' own), deferred-stop (its steps, the stop read every few "
        "tokens instead of after each), fused-step (one compiled call per token, inputs prepared once, the stop "
        "read late), through generate(custom_generate=...)"
    )
    short_name = "loop"
    choices = (STOCK_LOOP, "deferred-stop", "fused-step")  # but generate, the LOOPS of worker/decode_loops.py
    default = STOCK_LOOP
    failure_words = ("decode loop", "custom_generate")
    worker_hook = "autotune.worker.decode_loops"  # generate_arguments: the loop given to generate()
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
        self.hook(plan, value)
        plan.not_servable.append(f"decode_loop={value} (serve runs its own decoding loop)")

    def refuses(self, value: Value, plan: Plan) -> str | None:
        """A loop of autotune's replaces generate()'s greedy or sampling loop: not continuous batching's, nor
        assisted decoding's."""
        if value == STOCK_LOOP:
            return None
        if plan.batching == "continuous":
            why = "continuous batching (generate_batch) runs a decoding loop of its own"
        elif any(name in plan.generate for name in ASSISTED):
            why = "assisted decoding (speculative) runs a decoding loop of its own"
        else:
            return None
        return f"decode_loop={value} replaces generate()'s greedy or sampling loop; {why}"

    def depends_on_version(self, value: Value) -> bool:
        """Each loop calls generate()'s internals, which change between transformers versions."""
        return value != STOCK_LOOP or super().depends_on_version(value)

    def deployment(self, value: Value | None) -> Deployment | None:
        """generate() given the loop's folder (`autotune loop` writes it) as custom_generate, and the trust its code
        needs."""
        if value is None or value == STOCK_LOOP:
            return None
        folder = default_folder(str(value))
        return Deployment(
            arguments=(
                Argument(
                    "custom_generate",
                    repr(folder),
                    f"decode_loop={value}, in place of generate()'s own loop: `autotune loop {value}` writes it",
                ),
                Argument("trust_remote_code", "True", "generate() runs the folder's custom_generate/generate.py"),
            ),
            entry={"name": value, "custom_generate": folder},
        )
