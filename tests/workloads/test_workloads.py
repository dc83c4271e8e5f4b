"""The workload kinds: what each says of itself, and that nothing outside its module branches on its name."""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import pytest

from autotune.errors import UserError
from autotune.space.knobs import KNOBS, RECIPES, check_aims
from autotune.specs import WorkloadSpec
from autotune.workloads import KINDS, Flag, WorkloadKind, foreign_flags, kind_flags, metrics_of_one_kind, workload_kind
from autotune.workloads.serve import ServeSpec

PACKAGE = Path(__file__).resolve().parents[2] / "autotune"


def test_the_registry_lists_the_kinds_in_order_and_the_workload_knob_takes_them():
    assert list(KINDS)[:3] == ["throughput", "latency", "serve"]  # the built-in kinds, in --workload's order
    assert KNOBS["workload"].choices == tuple(KINDS)
    with pytest.raises(UserError, match="--workload 'chat' is not a workload: use throughput, latency"):
        workload_kind("chat")


@pytest.mark.parametrize("name", list(KINDS))
def test_each_kind_names_a_runner_of_the_worker_that_takes_a_spec_and_its_phases(name):
    module, _, function = KINDS[name].runner.partition(":")
    assert module.startswith("autotune.worker.")
    runner = getattr(importlib.import_module(module), function)
    assert list(inspect.signature(runner).parameters) == ["spec", "phases"]


def test_a_latency_trial_runs_one_prompt_and_its_record_says_so():
    spec = WorkloadSpec("latency", batch_size=8)
    assert KINDS["latency"].requests(spec) == 1
    assert KINDS["latency"].as_run(spec).batch_size == 1
    assert KINDS["latency"].describe(spec) == "1 prompt at a time, 128 tokens in, 64 out"
    assert KINDS["throughput"].describe(spec) == "8 prompts at a time, 128 tokens in, 64 out"


def test_the_serve_kind_reads_its_own_flags_and_needs_a_servable_plan():
    serve = KINDS["serve"]
    options = serve.options({"--load": "rate=4,2", "--slo": "ttft_p95<=300ms", "--serve-port": None})
    # The spec fields of its flags: the SLO (WorkloadSpec's, every kind's that takes --slo) and its load, typed.
    assert options == {"slo": {"ttft_p95_s": 0.3}, "serve": ServeSpec(mode="rate", levels=[2.0, 4.0])}
    bracket = serve.options({"--load": "concurrency=1-32", "--slo": "ttft_p95<=1s"})["serve"]
    assert (bracket.mode, bracket.levels, bracket.bracket) == ("concurrency", [], [1.0, 32.0])
    with pytest.raises(UserError, match="--load rate=1-64: a range is searched for the highest load within --slo"):
        serve.options({"--load": "rate=1-64"})
    assert ServeSpec.of(serve.as_run(WorkloadSpec("serve"))) == ServeSpec()  # a serve trial switched to by the knob
    assert serve.plan_problem(["sdpa_backend=math"]) == "transformers serve has no flag for: sdpa_backend=math"
    assert KINDS["throughput"].plan_problem(["sdpa_backend=math"]) is None


def test_flags_of_another_kind_are_bad_input_naming_their_kind():
    given = {"--load": "rate=2", "--slo": None, "--serve-port": 8000}
    assert foreign_flags(KINDS["latency"], given) == "--load, --serve-port apply only to --workload serve"
    assert foreign_flags(KINDS["serve"], given) is None
    assert metrics_of_one_kind()["goodput_req_s"] == "serve"


def test_the_kinds_flags_are_collected_once_each_in_each_kinds_order_and_one_flag_spelled_two_ways_fails():
    first, shared, last = Flag("--first", "1"), Flag("--shared", "2"), Flag("--last", "3")

    class One(WorkloadKind):
        name, help, flags = "one", "", (shared,)

    class Other(WorkloadKind):
        name, help, flags = "other", "", (first, shared, last)

    class Unlike(WorkloadKind):
        name, help, flags = "unlike", "", (Flag("--shared", "said otherwise"),)

    assert kind_flags([One(), Other()]) == [first, shared, last]  # --first stays before --shared, as Other has it
    with pytest.raises(ValueError, match="workload unlike declares --shared unlike another kind does"):
        kind_flags([One(), Unlike()])


def test_every_flag_a_kind_declares_is_an_option_of_each_command_taking_a_workload_and_written_in_its_kind_only():
    import typer

    from autotune.cli import app

    declared = kind_flags(KINDS.values())
    assert [flag.name for flag in declared if flag in KINDS["serve"].flags] == [
        "--load",
        "--slo",
        "--slo-share",
        "--serve-port",
    ]
    assert {flag.name for flag in declared} == {flag.name for kind in KINDS.values() for flag in kind.flags}
    for command in ("search", "measure"):
        params = typer.main.get_command(app).commands[command].params  # type: ignore[attr-defined]
        options = {name: param for param in params for name in param.opts}
        assert all(options[flag.name].help == flag.help for flag in declared), command
    generic = "".join(path.read_text() for path in [*(PACKAGE / "cli").glob("*.py"), PACKAGE / "specs.py"])
    assert not [flag.name for flag in declared if f'"{flag.name}"' in generic]


def test_each_kinds_objectives_call_for_declared_recipes_and_an_unknown_one_fails():
    check_aims(KINDS, RECIPES)

    class Planted(WorkloadKind):
        name = "planted"
        help = "a kind whose speed objectives call for a recipe nobody declared"
        aims: ClassVar[Mapping[str, tuple[str, ...]]] = {"speed": ("fastest",)}

    with pytest.raises(ValueError, match="workload planted calls for recipe 'fastest'"):
        check_aims({"planted": Planted()}, RECIPES)


def kind_name_branches(package: Path, kinds: set[str]) -> list[str]:
    """Comparisons of a workload or its kind with a kind's name (`spec.kind == "serve"`, `workload in ("latency",
    ...)`) outside autotune/workloads/. A figure or a field of that name (`"throughput" in figures`) is not one."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.parent.name == "workloads":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and _names_a_kind(node, kinds) and _compares_a_workload(node):
                found.append(f"{path.relative_to(package)}:{node.lineno}")
    return found


def _names_a_kind(node: ast.Compare, kinds: set[str]) -> bool:
    operands = [node.left, *node.comparators]
    literals = [o for o in operands if isinstance(o, ast.Constant)]
    literals += [e for o in operands if isinstance(o, ast.Tuple | ast.List | ast.Set) for e in o.elts]
    return any(isinstance(literal, ast.Constant) and literal.value in kinds for literal in literals)


def _compares_a_workload(node: ast.Compare) -> bool:
    named = [ast.unparse(o) for o in (node.left, *node.comparators) if isinstance(o, ast.Name | ast.Attribute)]
    return any("kind" in name or "workload" in name for name in named)


def test_no_module_outside_the_workloads_branches_on_a_kinds_name(tmp_path):
    assert kind_name_branches(PACKAGE, set(KINDS)) == []
    (tmp_path / "search").mkdir()
    branches = 'spec.kind == "serve" or "throughput" in figures or spec.workload in ("latency",)'
    planted = f"def f(spec, figures):\n    return {branches}\n"
    (tmp_path / "search" / "loop.py").write_text(planted)
    assert kind_name_branches(tmp_path, set(KINDS)) == ["search/loop.py:2", "search/loop.py:2"]
