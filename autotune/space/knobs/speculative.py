"""Speculative decoding knobs: the method, the tokens drafted per step, the early-exit layer."""

from __future__ import annotations

from typing import Any

from autotune.space.knobs.base import (
    NEUTRAL,
    DeviceType,
    Expectation,
    Knob,
    Refusal,
    Target,
    Value,
    WholeNumberKnob,
    register,
)
from autotune.space.plan import Call, Plan


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

    def expect(self, value: Value, device: DeviceType) -> Expectation:
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
class SpeculativeTokensKnob(WholeNumberKnob):
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
class EarlyExitLayerKnob(WholeNumberKnob):
    name = "early_exit_layer"
    help = "speculative=early_exit: the layer whose output drafts tokens (assistant_early_exit)"
    short_name = "exit_layer"
    after = ("speculative",)  # sets early_exit's layer
    counts = "a layer"

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if "assistant_early_exit" in plan.generate:
            plan.generate["assistant_early_exit"] = value
