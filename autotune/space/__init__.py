"""Search space: knob handlers, the declarative space, and the plan a configuration turns into."""

from autotune.space.knobs import KNOBS, Knob, Needs, Target, build_plan
from autotune.space.plan import Call, Plan, Ref
from autotune.space.space import Config, KnobSpec, Rule, SearchSpace, config_key, load_space, parse_space

__all__ = [
    "KNOBS",
    "Call",
    "Config",
    "Knob",
    "KnobSpec",
    "Needs",
    "Plan",
    "Ref",
    "Rule",
    "SearchSpace",
    "Target",
    "build_plan",
    "config_key",
    "load_space",
    "parse_space",
]
