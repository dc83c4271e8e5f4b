"""One handler per knob, grouped by family: which values a knob takes, what they need to run, and what they do
to a plan; and the recipes that combine them.

Adding a knob means one handler in the module of its family and one entry in the search-space YAML
(docs/adding-a-knob.md). What a value needs (hardware, packages, a workload) is data on its handler;
autotune/space/rules.py is the one module that reads it and decides what can run where.

The families register their knobs as they are imported, so the order of the imports below is the registry's
order: the order knobs are listed in, blamed for a failure's words, and applied when `after` leaves a tie.
"""

# isort: off
from autotune.space.knobs import precision, attention, quantization, parallelism, cache_compile, batching
from autotune.space.knobs import execution, speculative, decoding

# isort: on
from autotune.space.knobs.attention import AttentionKnob
from autotune.space.knobs.base import (
    FLASH,
    KNOBS,
    NEUTRAL,
    RECIPES,
    Argument,
    Deployment,
    DeviceType,
    Expectation,
    Knob,
    Needs,
    Recipe,
    Refusal,
    Requires,
    Target,
    Value,
    build_order,
    build_plan,
    check_aims,
    check_recipes,
    knob_defaults,
    short_name,
)
from autotune.space.knobs.execution import WorkloadKnob
from autotune.space.knobs.precision import DtypeKnob
from autotune.workloads import KINDS

FAMILIES = (precision, attention, quantization, parallelism, cache_compile, batching, execution, speculative, decoding)
BUILD_ORDER = build_order(KNOBS)  # checked once here: an unknown name or a cycle in `after` fails at import
check_recipes(RECIPES, KNOBS)  # and a recipe that names an unknown knob or value
check_aims(KINDS, RECIPES)  # and a workload kind that calls for a recipe nobody declared

__all__ = [
    "BUILD_ORDER",
    "FAMILIES",
    "FLASH",
    "KNOBS",
    "NEUTRAL",
    "RECIPES",
    "Argument",
    "AttentionKnob",
    "Deployment",
    "DeviceType",
    "DtypeKnob",
    "Expectation",
    "Knob",
    "Needs",
    "Recipe",
    "Refusal",
    "Requires",
    "Target",
    "Value",
    "WorkloadKnob",
    "build_order",
    "build_plan",
    "check_recipes",
    "knob_defaults",
    "short_name",
]
