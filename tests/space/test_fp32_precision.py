"""The fp32_precision knob (docs/adding-a-knob.md's worked example): generate() inside torch.backends.flags(), which
sets the internal precision of float32 matmuls; TensorFloat-32 on Ampere or newer GPUs, bfloat16 through oneDNN on
CPUs where it does (the trial worker's probe asks), and only from the torch that has the setting."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest

from autotune import profiles
from autotune.measure.prepare import runnable_space
from autotune.paths import PACKAGED_SPACE
from autotune.profiles import PROFILES
from autotune.report.snippets import python_snippet, serve_command
from autotune.search.dry_run import dry_run
from autotune.space import Call, Target, build_plan, load_space, rules
from autotune.specs import BudgetSpec, HardwareSpec, ModelSpec, SearchRequest
from tests.conftest import BRIEF, run_cli

FLOAT32 = {"dtype": "float32", "attn_implementation": "sdpa", "quantization": "none", "batching": "generate"}
SPACE = load_space(PACKAGED_SPACE)
NEVER_USED = "bfloat16 is never used on this CPU"  # the start of the reason bf16 is left out with


class AnsweringHost:
    """A machine that answers as told, and counts the probe's questions."""

    def __init__(self, bf16_changes_matmuls: bool) -> None:
        self.answer = bf16_changes_matmuls
        self.asked = 0

    def visible_gpus(self) -> int:
        return 0

    def bf16_changes_fp32_matmuls(self) -> bool:
        self.asked += 1
        return self.answer


def space_listing_bf16(folder: Path) -> Path:
    """The default space with bf16 among fp32_precision's values, as a space of one's own may list it."""
    text = PACKAGED_SPACE.read_text()
    declared = "    values: [ieee, tf32]   #"
    assert text.count(declared) == 1
    path = folder / "with-bf16.yaml"
    path.write_text(text.replace(declared, "    values: [ieee, tf32, bf16]   #"))
    return path


def test_the_plan_runs_generate_inside_the_precision_and_ieee_is_the_baseline():
    plan = build_plan({**FLOAT32, "fp32_precision": "tf32"}, Target("cuda"))
    assert plan.contexts == [Call("torch.backends.flags", {"fp32_precision": "tf32"})]
    code = python_snippet("org/model", plan, "cuda", 16)
    ast.parse(code)
    assert "with torch.backends.flags(fp32_precision='tf32'):\n    outputs = model.generate(" in code
    assert "fp32_precision=tf32" in serve_command("org/model", plan, "cuda").splitlines()[1]  # serve has no flag
    assert build_plan({**FLOAT32, "fp32_precision": "ieee"}, Target("cpu")) == build_plan(FLOAT32, Target("cpu"))


def test_it_applies_to_float32_under_generate_and_tf32_needs_an_ampere_gpu():
    assert SPACE.normalize({**FLOAT32, "fp32_precision": "tf32"})["fp32_precision"] == "tf32"
    assert "fp32_precision" not in SPACE.normalize({**FLOAT32, "dtype": "bfloat16", "fp32_precision": "tf32"})
    assert "fp32_precision" not in SPACE.normalize({**FLOAT32, "batching": "continuous", "fp32_precision": "tf32"})
    assert SPACE.prune(PROFILES["cpu"].why_not_value).knob("fp32_precision").values == ("ieee",)
    assert "Ampere" in (PROFILES["t4"].why_not_value("fp32_precision", "tf32") or "")
    assert PROFILES["a10g"].why_not_value("fp32_precision", "tf32") is None


def test_a_torch_without_the_setting_refuses_it_with_what_to_upgrade():
    config = {**FLOAT32, "fp32_precision": "bf16"}
    refused = rules.installation_problem(config, lambda requirement: "2.8.0" if requirement.package == "torch" else "9")
    assert refused is not None and (refused.knob, refused.value) == ("fp32_precision", "bf16")
    upgrade = "torch 2.8.0 has no fp32_precision setting of torch.backends.flags (it has from 2.9): upgrade torch"
    assert refused.message.endswith(upgrade)
    assert rules.installation_problem(config, lambda requirement: "2.13.0") is None


def test_bf16_is_kept_on_a_cpu_where_it_changes_the_matmuls_and_left_out_with_why_where_it_does_not():
    cpu, h100 = PROFILES["cpu"], PROFILES["h100"]
    assert rules.hardware_problem("fp32_precision", "bf16", cpu, AnsweringHost(True)) is None
    reason = rules.hardware_problem("fp32_precision", "bf16", cpu, AnsweringHost(False)) or ""
    assert reason.startswith(NEVER_USED) and "autotune/worker/fpmath.py" in reason
    assert rules.left_out_for_this_machine("fp32_precision", "bf16", reason)
    unasked = AnsweringHost(False)
    assert rules.hardware_problem("fp32_precision", "bf16", h100, unasked) is None
    assert rules.hardware_problem("fp32_precision", "ieee", cpu, unasked) is None
    assert unasked.asked == 0  # only the value that needs the answer, and only on a CPU


@pytest.mark.parametrize("changes", [True, False])
def test_the_dry_run_offers_bf16_where_it_changes_the_matmuls_and_says_why_not_where_it_does_not(
    changes: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(profiles, "bf16_changes_fp32_matmuls", lambda: changes)
    space = space_listing_bf16(tmp_path)
    kept = runnable_space(load_space(space), PROFILES["cpu"], Target("cpu")).knob("fp32_precision").values
    request = SearchRequest(ModelSpec("demo"), HardwareSpec(gpu="cpu"), budget=BudgetSpec(max_trials=2))
    notes = dry_run(replace(request, space_path=space)).notes
    if changes:
        assert kept == ("ieee", "bf16") and notes == ()
    else:
        assert kept == ("ieee",)
        assert len(notes) == 1 and notes[0].startswith(f"not searched: fp32_precision=bf16, {NEVER_USED}")


@pytest.mark.slow
def test_bf16_runs_and_moves_the_quality_figures_where_this_cpu_says_it_changes_the_matmuls_else_it_is_refused(
    tmp_path: Path, cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
):
    """The float32 demo model with fp32_precision=bf16, on whichever CPU runs this: the probe the search prunes with
    answers, and the command does what follows from the answer."""
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", cli_env["AUTOTUNE_CACHE_DIR"])  # its answer kept where the CLI's is
    changes = profiles.bf16_changes_fp32_matmuls()
    args = ["measure", "--model", "demo", "--device", "cpu", "--batch-size", "2", "--input-len", "32", "--output-len",
            "16", "--set", "dtype=float32", "--set", "fp32_precision=bf16", "--json", *BRIEF]  # fmt: skip
    completed = run_cli(args, tmp_path, cli_env)
    dry = run_cli(["search", "--model", "demo", "--gpu", "cpu", "--dry-run", "--trials", "2",
                   "--space", str(space_listing_bf16(tmp_path))], tmp_path, cli_env)  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    note = f"note: not searched: fp32_precision=bf16, {NEVER_USED}"
    if changes:
        document = json.loads(completed.stdout.strip().splitlines()[-1])
        assert document["outcome"] == "ok", document["message"]
        assert document["config"]["fp32_precision"] == "bf16"
        assert document["environment"]["bf16_changes_fp32_matmuls"] is True  # the worker's own probe agrees
        assert document["metrics"]["kl_divergence"] > 0  # the float32 reference computes its matmuls in float32
        assert note not in dry.stdout
    else:
        assert completed.returncode == 2, completed.stdout + completed.stderr
        assert f"fp32_precision=bf16 is not measured on profile cpu: {NEVER_USED}" in completed.stderr
        assert note in dry.stdout
