"""Shared flags: each written once (autotune/cli/flags.py), and groups of them build one frozen spec."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from autotune.cli import app
from autotune.cli.flags import Budget, Hardware, Model, with_groups
from autotune.cli.workload_flags import Workload
from autotune.specs import BudgetSpec, HardwareSpec, ModelSpec, SearchRequest, WorkloadSpec

SHARED = {
    ("search", "measure"): ["--model", "--revision", "--trust-remote-code", "--gpu", "--device", "--price",
                            "--workload", "--batch-size", "--input-len", "--output-len", "--prompts", "--load",
                            "--slo", "--serve-port", "--trial-timeout", "--space"],
    ("search", "worker"): ["--budget", "--trials", "--trial-timeout", "--device", "--trust-remote-code", "--artifacts"],
}  # fmt: skip


def _options(command: str) -> dict[str, Any]:
    """The command's options as Typer builds them, by flag."""
    found = typer.main.get_command(app).commands[command].params  # type: ignore[attr-defined]
    return {name: param for param in found if param.param_type_name == "option" for name in param.opts}


@pytest.mark.parametrize(("commands", "flags"), SHARED.items(), ids=["+".join(c) for c in SHARED])
def test_a_shared_flag_has_the_same_help_type_and_default_in_every_command(commands, flags):
    first, second = (_options(command) for command in commands)
    for flag in flags:
        a, b = first[flag], second[flag]
        facts = ("help", "default", "show_default", "min", "max", "required", "is_flag")
        assert [getattr(a, fact) for fact in facts] == [getattr(b, fact) for fact in facts], flag


def _spy() -> typer.Typer:
    """An app whose one command returns what its groups built, through the real Typer parsing."""
    spy = typer.Typer()
    seen: list[tuple] = []

    @spy.command()
    @with_groups
    def run(*, model: Model, hardware: Hardware, budget: Budget, workload: Workload) -> None:
        seen.append((model, hardware, budget, workload))

    spy.seen = seen  # type: ignore[attr-defined]
    return spy


def test_groups_build_their_specs_from_the_flags():
    spy = _spy()
    args = ["--model", "demo", "--gpu", "cpu", "--price", "2.5", "--budget", "90s", "--trials", "3",
            "--trial-timeout", "2m", "--workload", "latency", "--input-len", "32"]  # fmt: skip
    result = CliRunner().invoke(spy, args)
    assert result.exit_code == 0, result.output
    [(model, hardware, budget, workload)] = spy.seen  # type: ignore[attr-defined]
    assert model == ModelSpec("demo")
    assert hardware == HardwareSpec("cpu", None, 2.5)
    assert budget == BudgetSpec(budget_s=90.0, max_trials=3, trial_timeout_s=120.0)
    assert workload == WorkloadSpec("latency", batch_size=1, input_len=32)  # latency runs one prompt at a time


def test_defaults_are_those_written_once_in_the_groups():
    spy = _spy()
    assert CliRunner().invoke(spy, ["--model", "demo"]).exit_code == 0
    [(_, hardware, budget, workload)] = spy.seen  # type: ignore[attr-defined]
    assert hardware == HardwareSpec("auto", None, None)
    assert budget == BudgetSpec(None, None, 1200.0)
    assert workload == WorkloadSpec()


def test_min_seconds_sets_how_long_a_trial_times_generate_under_the_kinds_that_time_it():
    assert _workload(["--min-seconds", "0.5"]).min_seconds == 0.5
    assert _workload(["--workload", "latency", "--min-seconds", "0"]).min_seconds == 0
    assert _workload([]).min_seconds == WorkloadSpec.min_seconds


def test_one_batch_size_pins_the_batch_as_before_and_a_range_is_a_probes():
    """--batch-size 8 stores the very workload studies stored before capacity existed: a resumed study binds."""
    pinned = _workload(["--batch-size", "8"])
    assert pinned == WorkloadSpec("throughput", 8) and not pinned.probes_capacity
    before = ["kind", "batch_size", "input_len", "output_len", "prompts_path", "min_iterations", "min_seconds",
              "max_iterations", "warmup_iterations"]  # fmt: skip
    assert list(pinned.to_json()) == before
    probed = _workload(["--batch-size", "1-32", "--slo", "itl_p95<=50ms"])
    assert (probed.batch_size, probed.batch_sizes, probed.slo) == (32, [1, 2, 4, 8, 16, 32], {"itl_p95_s": 0.05})
    assert probed.probes_capacity


def _workload(args: list[str]) -> WorkloadSpec:
    spy = _spy()
    result = CliRunner().invoke(spy, ["--model", "demo", *args])
    assert result.exit_code == 0, result.output
    return spy.seen[-1][3]  # type: ignore[attr-defined]


def test_bad_input_in_a_group_is_one_user_error():
    from autotune.errors import UserError

    result = CliRunner().invoke(_spy(), ["--model", "demo", "--workload", "chat"])
    assert isinstance(result.exception, UserError)
    assert str(result.exception) == "--workload 'chat' is not a workload: use throughput, latency or serve"


def test_a_request_cannot_be_changed_in_place():
    request = SearchRequest(ModelSpec("demo"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.budget = BudgetSpec(max_trials=1)  # type: ignore[misc]
