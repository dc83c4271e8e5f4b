"""`autotune search --dry-run`: the planned first trials for any profile, on a machine without that GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.figures.objectives import PRESETS
from autotune.paths import PACKAGED_SPACE
from autotune.process.results import ModelSpec, WorkloadSpec
from autotune.profiles import PROFILES
from autotune.search.dry_run import DryRun, dry_run
from autotune.space import KNOBS, load_space
from autotune.specs import BudgetSpec, HardwareSpec, SearchRequest
from autotune.strategy.durations import ALIKE_MARGIN, EXTRAPOLATED_MARGIN
from autotune.strategy.queue import RECIPES
from autotune.workloads.serve import ServeSpec

GPU_PROFILES = ("t4", "a10g", "a100-80gb", "h100")
SPEED_PRESETS = ("throughput", "latency")
# The recipe each preset's first objective calls for.
STACK_OF = {"throughput": "throughput", "latency": "latency", "memory": "memory", "balanced": "throughput"}


def planned(profile: str, preset: str, trials: int = 60) -> DryRun:
    chosen = PRESETS[preset]
    request = SearchRequest(
        ModelSpec("demo"),
        HardwareSpec(profile),
        WorkloadSpec(kind=chosen.workload),  # type: ignore[arg-type]
        budget=BudgetSpec(max_trials=trials),
        objectives=chosen.objectives,
    )
    return dry_run(request)


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_the_guides_stack_for_the_objective_runs_among_the_first_three_after_the_anchors(profile, preset):
    run = planned(profile, preset, trials=5)
    assert [t.why for t in run.trials[:2]] == ["reference", "baseline"]
    recipe = RECIPES[STACK_OF[preset]]
    stack = next(t for t in run.trials[2:5] if t.why.startswith(f"recommended for {recipe.aim}: "))
    if recipe.aim in ("throughput", "latency"):
        assert stack.config["dtype"] == ("float16" if profile == "t4" else "bfloat16")  # bf16 needs Ampere
        assert stack.config["cache_implementation"] == "static" and stack.config["compile"] == "reduce-overhead"
    if recipe.aim == "memory":
        assert stack.config["quantization"] == "bnb-4bit"
        assert stack.config["dtype"] == ("float16" if profile == "t4" else "bfloat16")  # the compute dtype


def _runnable(profile: str, knob: str) -> set:
    """The knob's values in the default space that the profile can run."""
    values = load_space(PACKAGED_SPACE).knob(knob).values
    return {value for value in values if PROFILES[profile].why_not_value(knob, value) is None}


@pytest.mark.parametrize("preset", SPEED_PRESETS)
@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_every_compile_value_runs_before_a_quantization_expected_to_lose_on_speed(profile, preset):
    run = planned(profile, preset, trials=300)
    positions = {}
    for number, trial in enumerate(run.trials):
        for name in ("compile", "quantization"):
            if name in trial.config and trial.why.startswith(("warm-up:", "recommended")):
                positions.setdefault((name, trial.config[name]), number)
    compiled = [n for (name, value), n in positions.items() if name == "compile" and value != "off"]
    losers = [
        n
        for (name, value), n in positions.items()
        if name == "quantization" and KNOBS["quantization"].expect(value, "cuda").speed < 1
    ]
    assert len(compiled) == len([v for v in _runnable(profile, "compile") if v != "off"])  # each compile value runs
    assert losers, "the quantization values run too, later"
    assert max(compiled) < min(losers)


@pytest.mark.parametrize("preset", [name for name, preset in PRESETS.items() if "peak_memory_gb" in preset.objectives])
@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_the_memory_stack_follows_the_compile_modes_when_memory_is_an_objective(profile, preset):
    """Memory is an objective but not the first: 4-bit weights wait for the other compile modes (which the priors
    expect to win on speed), not for everything else the space holds."""
    run = planned(profile, preset, trials=8)
    whys = [trial.why for trial in run.trials]
    memory = next(n for n, why in enumerate(whys) if why.startswith("recommended for memory: "))
    compiled = [n for n, t in enumerate(run.trials) if t.config.get("compile", "off") != "off"]
    if PRESETS[preset].objectives[0] == "peak_memory_gb":
        assert memory == 2
    else:
        assert len(compiled) == len(_runnable(profile, "compile")) - 1 and max(compiled) < memory <= 5


def test_a_dry_run_lists_as_many_trials_as_asked_with_their_expected_time():
    run = planned("h100", "balanced", trials=12)
    assert len(run.trials) == 12 and not run.sampler_next  # the strategy had more to plan
    assert run.checkpoint.startswith("bfloat16 (the demo model's)")
    assert run.trials[2].relative_seconds > run.trials[1].relative_seconds == 1.0  # compiling takes longest
    # at most, as the budget checks it: nothing known before a trial ended; then alike, or extrapolated
    assert run.trials[0].at_most is None
    assert run.trials[1].at_most == pytest.approx(ALIKE_MARGIN * run.trials[1].relative_seconds)
    assert run.trials[2].at_most == pytest.approx(EXTRAPOLATED_MARGIN * run.trials[2].relative_seconds)


def test_a_serve_dry_run_says_what_each_trial_s_capacity_bracket_may_cost():
    load = ServeSpec("rate", [], bracket=[4.0, 32.0])
    workload = WorkloadSpec("serve", input_len=32, output_len=16, serve=load, slo={"ttft_p95_s": 0.3})
    run = dry_run(SearchRequest(ModelSpec("demo"), HardwareSpec("cpu"), workload, budget=BudgetSpec(max_trials=2)))
    assert run.probe is not None and run.probe.startswith(
        "each trial measures up to 6 load levels (each at least 16 requests and 2 s of arrivals): rate 4, 8, 16, 32 "
        "while 95% of a level's requests meet the SLO, then up to 2 bisections between the highest level sustained "
        "and the lowest refused; the requests take 4-13 s to send (open loop), so a trial's at-most duration allows "
        "10 s more"
    )
    assert planned("h100", "balanced", trials=2).probe is None  # one batch per trial: nothing probed


def test_the_cli_prints_the_plan_as_json_and_creates_nothing(tmp_path: Path, bare_cli_env: dict[str, str]) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    command = [sys.executable, "-m", "autotune", "search", "--model", "demo", "--gpu", "h100", "--dry-run", "--json"]
    done = subprocess.run([*command, "--trials", "5"], cwd=cwd, env=bare_cli_env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert [set(entry) for entry in plan] == [{"config", "why"}] * 5
    assert plan[0]["why"] == "reference" and plan[2]["why"].startswith("recommended for throughput")
    assert plan[2]["config"]["compile"] == "reduce-overhead"
    assert list(cwd.iterdir()) == []  # no study, no report, no folder
    assert not Path(bare_cli_env["AUTOTUNE_CACHE_DIR"]).exists()  # nor anything cached


def test_a_dry_run_says_what_each_trials_capacity_probe_tries_and_may_cost():
    workload = WorkloadSpec(batch_size=32, batch_sizes=[1, 2, 4, 8, 16, 32], slo={"itl_p95_s": 0.005})
    run = dry_run(SearchRequest(ModelSpec("demo"), HardwareSpec("h100"), workload, budget=BudgetSpec(max_trials=3)))
    assert run.probe == (
        "each trial probes its capacity: batch sizes 1, 2, 4, 8, 16, 32, climbing within itl_p95<=5ms and the memory; "
        "up to about 6x a trial of one batch of the same configuration: a plain trial here is such a probe"
    )
    assert planned("h100", "balanced", trials=3).probe is None  # one batch: no probe
