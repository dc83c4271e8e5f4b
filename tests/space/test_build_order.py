"""The plan is built in the order each knob states (`after`), never in the order the handlers are written: under a
shuffled registry, every configuration of the default space builds the same plan for a GPU, and every configuration
the cpu profile searches (it refuses the others before any plan is built) the same plan for a CPU."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from autotune.paths import PACKAGED_SPACE
from autotune.profiles import PROFILES
from autotune.space import KNOBS, Knob, Plan, SearchSpace, Target, build_plan, load_space
from autotune.space.knobs import build_order

SHUFFLES = 2


@contextmanager
def registry_in_order(names: list[str]) -> Iterator[None]:
    """KNOBS reordered for the block: what reordering the classes of knobs.py would do."""
    original = dict(KNOBS)
    KNOBS.clear()
    KNOBS.update({name: original[name] for name in names})
    try:
        yield
    finally:
        KNOBS.clear()
        KNOBS.update(original)


def same_plan(plan: Plan, other: Plan) -> bool:
    """Equal, but for the order of the entries independent knobs append to the plan's lists (serve flags, contexts,
    not-servable notes): only their written order follows the registry, never what runs."""
    return plan == other or (
        (plan.load, plan.generate, plan.batching, plan.continuous, plan.workload, plan.worker_hooks)
        == (other.load, other.generate, other.batching, other.continuous, other.workload, other.worker_hooks)
        and _same_items(_flag_groups(plan.serve_flags), _flag_groups(other.serve_flags))
        and _same_items(plan.contexts, other.contexts)
        and sorted(plan.not_servable) == sorted(other.not_servable)
    )


def _flag_groups(tokens: list[str]) -> list[tuple[str, ...]]:
    """`transformers serve` flags, each with its values: ["--a", "1", "--b"] -> [("--a", "1"), ("--b",)]."""
    groups: list[tuple[str, ...]] = []
    for token in tokens:
        if token.startswith("--"):
            groups.append((token,))
        else:
            groups[-1] += (token,)
    return groups


def _same_items(items: list, others: list) -> bool:
    """The same entries, each as often, in any order (entries need not be hashable: contexts hold dicts)."""
    rest = list(others)
    for item in items:
        if item not in rest:
            return False
        rest.remove(item)
    return not rest


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    return load_space(PACKAGED_SPACE)


# The configurations each target builds plans for: on a GPU every one of the default space (about 610,000: each value
# is one some card runs), on a CPU those the cpu profile keeps (about 65,000).
SEARCHED = {"cuda": lambda space: space, "cpu": lambda space: space.prune(PROFILES["cpu"].why_not_value)}


@pytest.mark.slow  # 3 orders x ~610,000 plans for cuda: about 45 s on one core; cpu about a tenth of it
@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_every_configuration_of_the_default_space_builds_the_same_plan_under_a_shuffled_registry(device_type, space):
    configurations = list(SEARCHED[device_type](space).configurations())
    target = Target(device_type, requests=1, tokens_per_request=192, assistant_model="draft")
    expected = [build_plan(config, target) for config in configurations]
    rng = random.Random(32)
    for _ in range(SHUFFLES):
        names = list(KNOBS)
        rng.shuffle(names)
        with registry_in_order(names):
            differing = [
                config
                for config, plan in zip(configurations, expected, strict=True)
                if not same_plan(build_plan(config, target), plan)
            ]
        assert differing[:3] == [], f"registry order {names} changes the plan"


def test_a_knob_is_applied_after_the_knobs_it_names():
    order = build_order(KNOBS)
    for name, knob in KNOBS.items():
        assert all(order.index(other) < order.index(name) for other in knob.after), name


class _Loop(Knob):
    name = "loop_a"
    after = ("loop_b",)


class _LoopBack(Knob):
    name = "loop_b"
    after = ("loop_a",)


class _Unknown(Knob):
    name = "unknown_after"
    after = ("no_such_knob",)


def test_a_cycle_or_an_unknown_name_in_after_is_an_error():
    with pytest.raises(ValueError, match="cycle"):
        build_order({"loop_a": _Loop(), "loop_b": _LoopBack()})
    with pytest.raises(ValueError, match="no_such_knob"):
        build_order({**KNOBS, "unknown_after": _Unknown()})


def test_an_order_missed_in_after_shows_as_another_plan():
    """The shuffle test has teeth: without `after`, compile applied before the cache keeps disable_compile."""
    config = {"cache_implementation": "static", "compile": "default"}
    target = Target("cuda")
    names = [name for name in KNOBS if name != "cache_implementation"] + ["cache_implementation"]
    compile_knob = KNOBS["compile"]
    original_after = type(compile_knob).after
    type(compile_knob).after = ()
    try:
        with registry_in_order(names):
            careless = build_plan(config, target)
    finally:
        type(compile_knob).after = original_after
    assert careless.generate.get("disable_compile") is True
    assert "disable_compile" not in build_plan(config, target).generate
