"""Batching knobs: generate() on one padded batch or continuous batching, and continuous batching's own settings
(tokens per forward pass, page size, CUDA graphs, async batching)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import ClassVar

from autotune.space.knobs.base import (
    NEUTRAL,
    Argument,
    AutoOnOffKnob,
    Deployment,
    DeviceType,
    Expectation,
    Knob,
    Needs,
    Recipe,
    Refusal,
    Target,
    Value,
    WholeNumberKnob,
    declare_recipe,
    register,
)
from autotune.space.plan import Plan


@register
class BatchingKnob(Knob):
    name = "batching"
    help = "generate(): one padded batch; continuous: generate_batch() with a paged cache"
    choices = ("generate", "continuous")
    default = "generate"

    def expect(self, value: Value, device: DeviceType) -> Expectation:
        if value != "continuous":
            return NEUTRAL
        # "maximizes throughput by keeping the GPU busy" [overview, serving]; on CPU generate_batch ran slower [cpu]
        return Expectation(speed=1.2 if device == "cuda" else 0.6, time=1.3)

    def ends_each_request_alone(self, value: Value | None) -> bool:
        return value == "continuous"

    def duration_group(self, value: Value | None) -> object:
        return value

    def depends_on_version(self, value: Value) -> bool:
        """Continuous batching's configuration is what autotune/worker/compat.py renames between versions."""
        return value == "continuous" or super().depends_on_version(value)

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


def paged_cache_for(plan: Plan, requests: int) -> Plan:
    """The plan with its paged cache sized for `requests` at once instead of the requests it was built for (a capacity
    probe's chosen batch, where the plan was built for its largest), each request's pages kept; any other plan as is."""
    continuous = plan.continuous
    built_for = continuous.get("max_requests_per_batch")
    if plan.batching != "continuous" or not built_for or built_for == requests:
        return plan
    pages_per_request = (continuous["num_blocks"] - SPARE_PAGES) // built_for
    num_blocks = requests * pages_per_request + SPARE_PAGES
    resized_cache = {**continuous, "num_blocks": num_blocks, "max_requests_per_batch": requests}
    resized = replace(plan, continuous=resized_cache, serve_flags=list(plan.serve_flags))
    _set_flag(resized.serve_flags, "--cb-num-blocks", str(num_blocks))
    return resized


def _set_flag(flags: list[str], flag: str, value: str) -> None:
    if flag in flags:
        flags[flags.index(flag) + 1] = value
    else:
        flags += [flag, value]


@register
class MaxBatchTokensKnob(WholeNumberKnob):
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
class PageSizeKnob(WholeNumberKnob):
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


@register
class CudaGraphKnob(AutoOnOffKnob):
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
class AsyncBatchingKnob(AutoOnOffKnob):
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
class PrefixReuseKnob(AutoOnOffKnob):
    name = "prefix_reuse"
    help = (
        "a prefix requests share (a conversation's earlier turns, shared blocks) computed once: continuous batching "
        "shares a prefix's full pages itself (auto, transformers 5.17 and later; off stops it), generate() reuses a "
        "conversation's prompt cache when on (one request at a time)"
    )
    short_name = "prefix"
    after = ("batching",)  # what it sets depends on the batching
    worker_hook = "autotune.worker.prefix_reuse"  # generate()'s prompt cache, kept between a conversation's turns
    failure_words = ("past_key_values", "prefix", "block sharing")
    refused = (
        Refusal(("on", "off"), None, "reusing a shared prefix changes nothing where requests share none", True),
        Refusal(("on",), 1, "generate()'s prompt cache serves one request at a time"),
    )

    def expect(self, value: Value, device: DeviceType) -> Expectation:
        return NEUTRAL if value == "auto" else Expectation(speed=1.1 if value == "on" else 0.95, spread=0.25)

    def depends_on_version(self, value: Value) -> bool:
        """Continuous batching's sharing of pages, and the prompt cache's DynamicCache.crop, are each version's."""
        return value != "auto" or super().depends_on_version(value)

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if value == "auto":
            return
        if plan.batching == "continuous":
            plan.continuous["allow_block_sharing"] = value == "on"
            plan.not_servable.append(f"prefix_reuse={value} (serve has no flag for continuous batching's sharing)")
        elif value == "on":
            self.hook(plan, value)
            plan.not_servable.append("prefix_reuse=on (transformers serve keeps no prompt cache for generate())")

    def deployment(self, value: Value | None) -> Deployment | None:
        """generate() given the cache the conversation's previous turn left, cut to that turn's input."""
        if value != "on":
            return None
        why = (
            "prefix_reuse=on: the cache generate() returned for this conversation's previous turn "
            "(return_dict_in_generate=True), cut to that turn's input with .crop(len(its input_ids)); None for a "
            "first turn"
        )
        return Deployment(
            arguments=(Argument("past_key_values", "None", why), Argument("return_dict_in_generate", "True", "")),
            entry={"prompt_cache": "per conversation: the previous turn's cache, cut to its input"},
        )


declare_recipe(
    Recipe(
        "serve",
        "continuous batching",
        (("batching", ("continuous",)), ("dtype", ("bfloat16", "float16"))),
        "continuous batching keeps the GPU busy under concurrent requests (serving, overview)",
        gpu_only=frozenset({"dtype"}),
    )
)
