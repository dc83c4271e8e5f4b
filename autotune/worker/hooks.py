"""The worker code a knob's values need beyond the plan's arguments, found through the plan.

A knob handler names its module (`Knob.worker_hook`, autotune/space/knobs/) and writes it into the plan it builds,
with the value (`Knob.hook`); the worker imports the modules a plan names and calls, for each, what it defines of:
`before_load(knob)` before the model is loaded, `after_load(model, knob)` after, and `generate_arguments(knob, value)`
for the keyword arguments every generate() of the trial is given beside the plan's (a decoding loop's
custom_generate; the handler's `deployment` says what a deployment passes instead). A hook refuses what cannot run
with an UnsupportedError that blames its knob.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from autotune.space.plan import Plan, WorkerHook

ALLOWED_PREFIX = "autotune.worker."  # a plan read from storage can name no other module


def _modules(plan: Plan) -> list[tuple[str, WorkerHook, ModuleType]]:
    found = []
    for knob, hook in plan.worker_hooks.items():
        if not hook.module.startswith(ALLOWED_PREFIX):
            raise ValueError(f"knob {knob}'s worker hook {hook.module!r} is not a module of {ALLOWED_PREFIX}")
        found.append((knob, hook, importlib.import_module(hook.module)))
    return found


def before_load(plan: Plan) -> None:
    for knob, _, module in _modules(plan):
        if hasattr(module, "before_load"):
            module.before_load(knob)


def after_load(plan: Plan, model: Any) -> None:
    for knob, _, module in _modules(plan):
        if hasattr(module, "after_load"):
            module.after_load(model, knob)


def generate_arguments(plan: Plan) -> dict[str, Any]:
    """The keyword arguments the plan's worker hooks add to every generate() call of the trial."""
    arguments: dict[str, Any] = {}
    for knob, hook, module in _modules(plan):
        if hasattr(module, "generate_arguments"):
            arguments |= module.generate_arguments(knob, hook.value)
    return arguments
