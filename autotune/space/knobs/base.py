"""The base of the knob handlers: what a handler says (`Knob`), what a value needs (`Needs`, `Requires`,
`Refusal`), what the guides lead one to expect of it (`Expectation`), what a deployment passes for it beyond the
plan's arguments (`Deployment`), the registry and the build order of a plan, and the recipes (stacks the guides
recommend for one aim) the families declare beside their knobs.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from autotune.space.plan import Plan, WorkerHook

DeviceType = Literal["cpu", "cuda"]
Value = str | int


@dataclass(frozen=True)
class Needs:
    """What a knob value needs from the hardware (checked against the profile before the study starts)."""

    cuda: bool = False
    min_compute_capability: float | None = None
    below_compute_capability: float | None = None
    gpus: int = 1  # how many GPUs of the profile's type it runs on (tensor parallelism)
    bf16_matmuls: bool = False  # on a CPU: fp32_precision=bf16 must change this machine's float32 matmuls (it asks)
    device_runs_ahead: bool = False  # a device the host queues work for (a GPU): on a CPU the value changes nothing
    why: str = ""


@dataclass(frozen=True)
class Expectation:
    """What the guides lead one to expect of a knob value on one device type, against the knob's transformers
    default (or, for a knob whose default depends on the model, against a fixed value the handler names).

    A prior, not a figure: what a trial measures always wins over it. Factors multiply; `kl` adds.
    """

    speed: float = 1.0  # decode tokens/s (per-token and first-token latency divide by it)
    memory: float = 1.0  # peak memory
    kl: float = 0.0  # nats/token added to the divergence from the most precise reference
    time: float = 1.0  # the trial's duration (loading, first call or compile, measuring) against a plain trial
    spread: float = 0.35  # how unsure: the standard deviation of ln(speed) and ln(memory) around the factors


NEUTRAL = Expectation(spread=0.2)


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
    """Values a workload could only see refused (or that would change nothing for it), so a search for that workload
    never plans them."""

    values: tuple[Value, ...]
    most_requests: int | None  # refused when the workload runs more requests at once; None: however many it runs
    why: str
    shared_prefixes: bool = False  # refused unless the workload's requests share prefixes (a trace's conversations)


@dataclass(frozen=True)
class Argument:
    """One keyword argument of generate() as a deployment's Python writes it, with the comment that goes beside it."""

    name: str
    source: str  # Python source: "'./autotune-fused-step'"
    comment: str = ""


@dataclass(frozen=True)
class Deployment:
    """What a deployment passes generate() for a knob's value beyond the plan's arguments: the code the trial worker
    runs through the knob's worker hook, as the snippets (autotune/report/snippets.py) write it."""

    arguments: tuple[Argument, ...]  # in the Python snippet's generate() call
    entry: Mapping[str, Any]  # in the JSON snippet, under the knob's name


@dataclass(frozen=True)
class Target:
    """What the plan is built for: the device, and the workload's largest shape (it sizes the paged cache)."""

    device_type: DeviceType
    requests: int = 8
    tokens_per_request: int = 192  # prompt + generated tokens
    workload: str = "throughput"  # the study's kind; a workload knob in the space overrides it
    assistant_model: str | None = None  # the draft model speculative=assistant loads (--assistant-model)
    shared_prefixes: bool = False  # its requests share prefixes (a trace's conversations or shared blocks)


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
    # The trial worker's module for what a value needs beyond the plan's arguments (a check before or after loading,
    # generate() arguments only worker code can build: autotune/worker/hooks.py); apply() names it in the plan with
    # `hook`, the worker finds it there, and `deployment` says what a deployment passes for it.
    worker_hook: ClassVar[str | None] = None

    @property
    def label(self) -> str:
        return self.short_name or self.name

    def memory_rank(self, value: Value) -> int | None:
        """Orders the memory a value needs, all else equal (higher needs more); None: not ordered."""
        return self.memory_ranks.get(value)

    def orders_memory(self) -> bool:
        return bool(self.memory_ranks)

    def expect(self, value: Value, device: DeviceType) -> Expectation:
        """What the guides lead one to expect of this value on this device type (a prior; see Expectation)."""
        return NEUTRAL

    def ends_each_request_alone(self, value: Value | None) -> bool:
        """Whether this value gives a request's place to the next one as soon as it ends, so that no decode step
        is spent on a finished request (continuous batching), where a static batch runs to its longest row."""
        return False

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

    def hook(self, plan: Plan, value: Value) -> None:
        """Have the worker run this knob's worker hook for the plan and this value."""
        assert self.worker_hook is not None, f"knob {self.name} names no worker hook"
        plan.worker_hooks[self.name] = WorkerHook(self.worker_hook, value)

    def deployment(self, value: Value | None) -> Deployment | None:
        """What a deployment passes generate() for this value beyond the plan's arguments (what the worker hook adds
        to the trial's), or None; `value` is None in plans stored before hooks carried it."""
        return None

    def refuses(self, value: Value, plan: Plan) -> str | None:
        """Why this value cannot run in this plan, which other knobs built (a combination: the value runs in other
        plans), or None. The trial worker asks before loading (autotune/space/rules.py, plan_problem)."""
        return None

    def depends_on_version(self, value: Value) -> bool:
        """Whether running this value goes through a path that differs by transformers version or by the packages
        beside it, so version conformance runs it on the lowest supported transformers on every CI run: a value that
        requires a package (`requires`), unless the handler says more."""
        return value in self.requires

    def check_value(self, value: Value, where: str) -> None:
        """ValueError unless this knob accepts the value (`where` says who named it)."""
        if not self.accepts(value):
            raise ValueError(f"{where}: knob {self.name} has no value {value!r}; it takes {self.describe_values()}")


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
    for name, knob in _current_build_order(tuple(KNOBS.items())):
        if name in config:
            knob.apply(config[name], plan, target)
    return plan


@functools.lru_cache(maxsize=8)
def _current_build_order(registered: tuple[tuple[str, Knob], ...]) -> tuple[tuple[str, Knob], ...]:
    """build_order of the registry as it is now, keyed by its names and handlers (tests reorder the registry): a key
    hashed in C, since every plan asks."""
    knobs = dict(registered)
    return tuple((name, knobs[name]) for name in build_order(knobs))


# ------------------------------------------------------------------------------------------------- recipes

FLASH = (
    "<the best flash attention installed>"  # a recipe's value: the strategy takes the best flash attention installed
)


@dataclass(frozen=True)
class Recipe:
    """A stack the guides recommend for one aim: knobs and the values to try for each, in order of preference.

    Declared in the family module of the knobs it is about; a workload names the aims its objectives call for
    (autotune/workloads/). Its knobs and values are checked against the registry at import (check_recipes).
    """

    aim: str
    title: str
    settings: tuple[tuple[str, tuple[Value, ...]], ...]
    source: str
    gpu_only: frozenset[str] = frozenset()  # knobs the recipe sets only on a GPU (elsewhere they keep the baseline's)


RECIPES: dict[str, Recipe] = {}


def declare_recipe(recipe: Recipe) -> Recipe:
    if recipe.aim in RECIPES:
        raise ValueError(f"two recipes for the aim {recipe.aim!r}")
    RECIPES[recipe.aim] = recipe
    return recipe


def check_recipes(recipes: Mapping[str, Recipe], knobs: Mapping[str, Knob]) -> None:
    """ValueError for a recipe that names a knob that is not registered, or a value its knob does not take."""
    for recipe in recipes.values():
        names = [name for name, _ in recipe.settings]
        for name in [*names, *recipe.gpu_only]:
            if name not in knobs:
                raise ValueError(f"recipe {recipe.aim!r} sets {name}, which is no registered knob")
        for name, values in recipe.settings:
            for value in values:
                if value != FLASH:
                    knobs[name].check_value(value, f"recipe {recipe.aim!r}")


def check_aims(kinds: Mapping[str, Any], recipes: Mapping[str, Recipe]) -> None:
    """ValueError for a workload kind (autotune/workloads/) whose objectives call for a recipe no family declares."""
    for kind in kinds.values():
        for family, aims in kind.aims.items():
            unknown = [aim for aim in aims if aim not in recipes]
            if unknown:
                raise ValueError(
                    f"workload {kind.name} calls for recipe {unknown[0]!r} ({family}), which is not declared"
                )


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
# [loops]     benchmarks/results/decode-loops-cpu.md: autotune's decoding loops against generate()'s on the CPU demo
# [headroom]  reports/gpu/2026-11-27-h100 and 2026-11-26-h100: generate() left about 1.4 ms per token outside the
#             compiled step on a 1.1B and an 8B model, at 0.56x-0.82x of the hand loop (issue 59)


class WholeNumberKnob(Knob):
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


class AutoOnOffKnob(Knob):
    """A ContinuousBatchingConfig switch of its own name: auto lets transformers decide, on and off force it."""

    choices = ("auto", "on", "off")
    default = "auto"
    # auto turns out as on or off: no lighter than off, no heavier than on.
    memory_ranks: ClassVar[dict[Value, int]] = {"off": 0, "auto": 1, "on": 2}
    serve_switch: ClassVar[tuple[str, str] | None] = None  # serve's (on, off) flags; None: it has none
    speed_on_cuda: ClassVar[float] = 1.0  # what forcing it on is expected to bring on CUDA, against auto

    def expect(self, value: Value, device: DeviceType) -> Expectation:
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
