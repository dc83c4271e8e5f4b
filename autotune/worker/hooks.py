"""The worker code a knob's values need beyond the plan's arguments, found through the plan.

A knob handler names its module (`Knob.worker_hook`, autotune/space/knobs/) and writes it into the plan it builds;
the worker imports the modules a plan names and calls, for each, `before_load(knob)` before the model is loaded
and `after_load(model, knob)` after (a module defines the ones it needs). A hook refuses what cannot run with an
UnsupportedError that blames its knob.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from autotune.space.plan import Plan

ALLOWED_PREFIX = "autotune.worker."  # a plan read from storage can name no other module


def _modules(plan: Plan) -> list[tuple[str, ModuleType]]:
    found = []
    for knob, module in plan.worker_hooks.items():
        if not module.startswith(ALLOWED_PREFIX):
            raise ValueError(f"knob {knob}'s worker hook {module!r} is not a module of {ALLOWED_PREFIX}")
        found.append((knob, importlib.import_module(module)))
    return found


def before_load(plan: Plan) -> None:
    for knob, module in _modules(plan):
        if hasattr(module, "before_load"):
            module.before_load(knob)


def after_load(plan: Plan, model: Any) -> None:
    for knob, module in _modules(plan):
        if hasattr(module, "after_load"):
            module.after_load(model, knob)
