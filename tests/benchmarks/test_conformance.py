"""benchmarks/conformance.py covers every knob value the cpu profile runs; measure on a custom space."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.paths import PACKAGED_SPACE
from autotune.profiles import PROFILES
from autotune.space import load_space
from benchmarks.conformance import cases
from tests.conftest import run_cli


def test_conformance_measures_every_value_the_cpu_profile_runs_once() -> None:
    planned = cases(PACKAGED_SPACE)
    runnable = load_space(PACKAGED_SPACE).prune(PROFILES["cpu"].why_not_value)
    for spec in runnable.knobs:
        for value in spec.values:
            assert any(case.config.get(spec.name) == value for case in planned), f"{spec.name}={value}"
    keys = [json.dumps(case.config, sort_keys=True) for case in planned]
    assert len(keys) == len(set(keys))
    assert planned[0].label.startswith("baseline")


@pytest.mark.slow
def test_measure_on_a_space_without_the_checkpoint_dtype_measures_the_defaults(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """The transformers defaults are measurable whatever the space offers (the demo checkpoint is bfloat16)."""
    space = tmp_path / "space.yaml"
    space.write_text("knobs:\n  dtype: [float32]\n  attn_implementation: [sdpa]\n")
    args = ["measure", "--model", "demo", "--device", "cpu", "--space", str(space), "--batch-size", "1",
            "--input-len", "16", "--output-len", "8", "--json"]  # fmt: skip
    completed = run_cli(args, tmp_path, cli_env)
    assert completed.returncode == 0, completed.stderr[-2000:]
    document = json.loads(completed.stdout.strip().splitlines()[-1])
    assert document["config"]["dtype"] == "bfloat16" and document["outcome"] == "ok"


def test_values_no_batch_can_run_are_measured_one_prompt_at_a_time() -> None:
    """Speculative decoding is refused on batches: conformance runs it on one prompt, so it really runs."""
    planned = cases(PACKAGED_SPACE)
    speculative = [case for case in planned if case.config.get("speculative", "none") != "none"]
    assert speculative and all(case.one_prompt_at_a_time for case in speculative)
    for case in speculative:
        assert case.workload[:4] == ["--workload", "latency", "--batch-size", "1"]
    batched = [case for case in planned if case not in speculative]
    assert all(case.workload[:4] == ["--workload", "throughput", "--batch-size", "2"] for case in batched)
