"""autotune's search strategy and the replay benchmark's harness, on a synthetic grid (no model runs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autotune.figures.metrics import METRICS, OBJECTIVES
from autotune.figures.objectives import PRESETS
from autotune.paths import PACKAGED_SPACE
from autotune.process.results import Outcome
from autotune.profiles import PROFILES
from autotune.space import config_key, load_space
from autotune.strategy.forecast import Forecaster
from autotune.strategy.queue import (
    Situation,
    compositions,
    next_planned,
    next_queued,
    promising_neighbours,
    rank,
    recommended_stacks,
    ruled_out,
    warm_up_set,
)
from autotune.testing.replay import Grid, ahead_at_every_budget, replay

REPO = Path(__file__).resolve().parents[2]
GRID_SPACE = load_space(REPO / "search_spaces" / "cpu-grid.yaml")
BASELINE = {"dtype": "bfloat16", "attn_implementation": "sdpa", "quantization": "none", "batching": "generate",
            "cache_implementation": "dynamic"}  # fmt: skip
REFERENCE = {**BASELINE, "dtype": "float32"}
BASELINE_FULL = {"dtype": "bfloat16", "attn_implementation": "sdpa", "sdpa_backend": "auto", "quantization": "none",
                 "use_kernels": "off", "tp_size": 1, "batching": "generate", "cache_implementation": "dynamic",
                 "execution_mode": "no_grad", "speculative": "none"}  # fmt: skip


# ------------------------------------------------------------------------------------------ rules


def test_an_oom_rules_out_configurations_that_need_more_memory():
    four_bit = {**BASELINE, "quantization": "bnb-4bit"}
    history = [(7, four_bit, Outcome.OOM.value)]
    assert "trial #7" in ruled_out({**four_bit, "dtype": "float32"}, history)  # wider dtype
    assert "trial #7" in ruled_out({**BASELINE, "quantization": "bnb-8bit"}, history)  # lighter quantization
    assert "trial #7" in ruled_out(BASELINE, history)
    assert ruled_out(four_bit, history) is not None  # the same configuration, of course
    assert ruled_out({**four_bit, "attn_implementation": "eager"}, history) is None  # another knob differs
    assert ruled_out({**four_bit, "cache_implementation": "quantized"}, history) is None


def test_more_tokens_per_batch_after_an_oom_are_ruled_out_fewer_are_not():
    continuous = {"dtype": "bfloat16", "attn_implementation": "sdpa", "quantization": "none",
                  "batching": "continuous", "max_batch_tokens": 512}  # fmt: skip
    history = [(3, continuous, "oom")]
    assert ruled_out({**continuous, "max_batch_tokens": 2048}, history) is not None
    assert ruled_out({**continuous, "max_batch_tokens": 256}, history) is None
    assert ruled_out({**continuous, "max_batch_tokens": 2048, "quantization": "bnb-4bit"}, history) is None


def test_other_failures_rule_out_nothing():
    history = [(1, BASELINE, "error"), (2, BASELINE, "timeout"), (3, BASELINE, "broken")]
    assert ruled_out({**BASELINE, "dtype": "float32"}, history) is None


# ---------------------------------------------------------------------------------------- warm-up


def test_the_warm_up_set_changes_one_knob_of_the_baseline_per_value():
    plan = warm_up_set(GRID_SPACE, BASELINE)
    values = sum(len(spec.values) for spec in GRID_SPACE.knobs) - len(GRID_SPACE.knobs)  # all but the baseline's
    assert len(plan) == values
    for planned in plan:
        assert GRID_SPACE.violation(planned.config) is None
        knob, value = planned.why.removeprefix("warm-up: ").split("=")
        assert str(planned.config[knob]) == value


def test_the_warm_up_set_changes_another_knob_when_a_rule_demands_it():
    space = load_space(PACKAGED_SPACE)
    plan = {p.why: p.config for p in warm_up_set(space, REFERENCE)}
    flash = plan["warm-up: attn_implementation=flash_attention_2"]
    assert flash["dtype"] in ("bfloat16", "float16")  # flash attention needs half precision
    assert plan["warm-up: compile=default"]["cache_implementation"] == "static"  # compile needs a static cache


def test_next_planned_skips_what_is_taken():
    plan = warm_up_set(GRID_SPACE, BASELINE)
    taken = {config_key(plan[0].config), config_key(plan[1].config)}
    assert next_planned(plan, taken) == plan[2]
    assert next_planned(plan, {config_key(p.config) for p in plan}) is None


# ------------------------------------------------------------------ compositions and predictions

COMPILED = {**BASELINE, "cache_implementation": "static", "compile": "default"}


def measured_from(grid: Grid, configs: list[dict]) -> dict[str, tuple[dict, dict]]:
    entries = {config_key(c): grid.trials[config_key(c)] for c in configs}
    return {key: (entry["config"], entry["metrics"]) for key, entry in entries.items() if entry["outcome"] == "ok"}


def test_compositions_combine_the_warm_up_changes_that_served_each_trade_off(grid):
    plan = warm_up_set(GRID_SPACE, BASELINE)
    measured = measured_from(grid, [BASELINE] + [p.config for p in plan])
    figures = {key: entry[1] for key, entry in measured.items()}
    composed = {p.why.rsplit(" for ", 1)[1]: p.config for p in compositions(GRID_SPACE, BASELINE, plan, figures)}
    # In the synthetic grid float32 and compiling are each faster than the baseline: together, faster still.
    assert composed["throughput"] == {**COMPILED, "dtype": "float32"}
    assert composed["memory"] == {**BASELINE, "quantization": "bnb-4bit"}  # float16 saves nothing over bfloat16
    for config in composed.values():
        assert GRID_SPACE.violation(config) is None  # bnb-4bit is never combined with compiling


def test_compositions_need_the_baseline_and_some_warm_up_trials(grid):
    plan = warm_up_set(GRID_SPACE, BASELINE)
    assert compositions(GRID_SPACE, BASELINE, plan, {}) == []
    only_baseline = {config_key(BASELINE): grid.trials[config_key(BASELINE)]["metrics"]}
    assert compositions(GRID_SPACE, BASELINE, plan, only_baseline) == []


def test_a_change_is_predicted_from_the_same_change_to_the_baseline():
    # Compiling doubled the baseline's throughput in the warm-up; applied to the faster reference, the
    # prediction (3000 tok/s) beats everything measured, so it is what runs next.
    measured = {
        config_key(BASELINE): (BASELINE, figures(1000, 2.0, 1e-4)),
        config_key(COMPILED): (COMPILED, figures(2000, 3.0, 1e-4)),
        config_key(REFERENCE): (REFERENCE, figures(1500, 4.0, 1e-6)),
    }
    forecaster = Forecaster(GRID_SPACE, BASELINE, "cpu", measured)
    first = rank(forecaster, [(p, False) for p in promising_neighbours(forecaster, [REFERENCE, COMPILED])])[0]
    assert first.planned.config == {**COMPILED, "dtype": "float32"}
    assert first.planned.why.startswith("predicted to extend the front: ")
    assert first.forecast.figures["throughput_tok_s"] == pytest.approx(3000)


def test_no_prediction_without_the_warm_up_trial_of_that_change():
    measured = {
        config_key(BASELINE): (BASELINE, figures(1000, 2.0, 1e-4)),
        config_key(REFERENCE): (REFERENCE, figures(1500, 4.0, 1e-6)),
    }
    forecaster = Forecaster(GRID_SPACE, BASELINE, "cpu", measured)
    ranked = rank(forecaster, [(p, False) for p in promising_neighbours(forecaster, [REFERENCE])])
    assert [s.planned.config for s in ranked] in ([], [BASELINE])  # only the dtype change was measured


def test_a_warm_up_change_is_forecast_from_the_priors_and_what_its_siblings_measured():
    eight_bit, four_bit = ({**BASELINE, "quantization": q} for q in ("bnb-8bit", "bnb-4bit"))
    before = Forecaster(GRID_SPACE, BASELINE, "cuda", {config_key(BASELINE): (BASELINE, figures(1000, 2.0, 1e-4))})
    expected = before.forecast(four_bit)
    assert expected.figures["throughput_tok_s"] < 1000 and expected.figures["peak_memory_gb"] < 1.0
    assert expected.hopeful["throughput_tok_s"] > expected.figures["throughput_tok_s"]
    # bnb-8bit ran at a tenth of the baseline's speed, far below its prior: 4-bit is expected slower too
    measured = {**before.measured, config_key(eight_bit): (eight_bit, figures(100, 1.2, 1e-3))}
    after = Forecaster(GRID_SPACE, BASELINE, "cuda", measured).forecast(four_bit)
    assert after.figures["throughput_tok_s"] < expected.figures["throughput_tok_s"] / 1.5


def test_nothing_is_predicted_once_the_whole_grid_is_measured(grid):
    measured = measured_from(grid, [t["config"] for t in grid.trials.values()])
    forecaster = Forecaster(GRID_SPACE, BASELINE, "cpu", measured)
    neighbours = promising_neighbours(forecaster, [c for c, _ in measured.values()])
    assert neighbours and rank(forecaster, [(p, False) for p in neighbours]) == []


# On a request trace (--traffic) goodput leads: the tokens the requests asked for, per second of the replay.
ON_A_TRACE = [METRICS[name] for name in ("goodput_tok_s", "peak_memory_gb", "kl_divergence")]
CONTINUOUS = next(p.config for p in warm_up_set(GRID_SPACE, BASELINE) if p.config["batching"] == "continuous")


def replayed(throughput: float, goodput: float, wasted: float, memory_gb: float, kl: float) -> dict[str, float]:
    return {**figures(throughput, memory_gb, kl), "goodput_tok_s": goodput, "wasted_share": wasted}


def test_on_a_trace_continuous_batching_is_expected_to_get_back_the_steps_the_baselines_batches_wasted():
    # The baseline's static batches spent 60% of their decode steps on finished requests: continuous batching,
    # each request ending alone, is expected at its priors' speed (slower than generate() on a CPU) over 1 - 0.6.
    measured = {config_key(BASELINE): (BASELINE, replayed(1000, 400, 0.6, 2.0, 1e-4))}
    uniform = Forecaster(GRID_SPACE, BASELINE, "cpu", measured).forecast(CONTINUOUS)
    traced = Forecaster(GRID_SPACE, BASELINE, "cpu", measured, objectives=ON_A_TRACE).forecast(CONTINUOUS)
    priors = uniform.figures["throughput_tok_s"] / 1000
    assert priors < 1
    assert traced.figures["goodput_tok_s"] == pytest.approx(400 * priors / (1 - 0.6))
    wasting_nothing = {config_key(BASELINE): (BASELINE, replayed(1000, 1000, 0.0, 2.0, 1e-4))}
    even = Forecaster(GRID_SPACE, BASELINE, "cpu", wasting_nothing, objectives=ON_A_TRACE).forecast(CONTINUOUS)
    assert even.figures["goodput_tok_s"] == pytest.approx(1000 * priors)


def test_on_a_trace_a_measured_change_moves_goodput_by_what_it_did_to_goodput():
    # Continuous batching decoded slower (600 against 1000 tok/s) but served twice the goodput: on float32 too,
    # the forecast takes the goodput's factor.
    measured = {
        config_key(BASELINE): (BASELINE, replayed(1000, 400, 0.6, 2.0, 1e-4)),
        config_key(CONTINUOUS): (CONTINUOUS, replayed(600, 800, 0.0, 3.0, 1e-4)),
        config_key(REFERENCE): (REFERENCE, replayed(1500, 600, 0.6, 4.0, 0.0)),
    }
    both = {**CONTINUOUS, "dtype": "float32"}
    traced = Forecaster(GRID_SPACE, BASELINE, "cpu", measured, objectives=ON_A_TRACE).forecast(both)
    assert traced.figures["goodput_tok_s"] == pytest.approx(600 * 2)
    uniform = Forecaster(GRID_SPACE, BASELINE, "cpu", measured).forecast(both)
    assert uniform.figures["throughput_tok_s"] == pytest.approx(1500 * 0.6)


def test_on_a_trace_whose_batches_wasted_steps_continuous_batching_runs_before_the_static_cache():
    measured = {
        config_key(BASELINE): (BASELINE, replayed(1000, 400, 0.6, 2.0, 1e-4)),
        config_key(REFERENCE): (REFERENCE, replayed(1500, 600, 0.6, 4.0, 0.0)),
    }
    plan = warm_up_set(GRID_SPACE, BASELINE)
    for objectives, continuous_first in ((OBJECTIVES, False), (ON_A_TRACE, True)):
        forecaster = Forecaster(GRID_SPACE, BASELINE, "cpu", measured, objectives=objectives)
        roles = [s.planned.why for s in rank(forecaster, [(p, True) for p in plan])]
        before = roles.index("warm-up: batching=continuous") < roles.index("warm-up: cache_implementation=static")
        assert before == continuous_first, roles


GPU_SPACE = load_space(PACKAGED_SPACE)


def test_the_recommended_stacks_run_right_after_the_anchors_on_a_gpu():
    speed, memory = recommended_stacks(GPU_SPACE, BASELINE_FULL, OBJECTIVES, "throughput", "cuda")
    assert speed.config["cache_implementation"] == "static" and speed.config["compile"] == "reduce-overhead"
    assert speed.config["dtype"] == "bfloat16" and speed.why.startswith("recommended for throughput: ")
    assert memory.config["quantization"] == "bnb-4bit" and memory.config["dtype"] == "bfloat16"
    situation = Situation(GPU_SPACE, BASELINE_FULL, "cuda")
    first = next_queued(situation, warm_up_set(GPU_SPACE, BASELINE_FULL), {}, set(), lambda c: None)
    assert first == speed
    taken = {config_key(speed.config), config_key(memory.config)}
    after = next_queued(situation, warm_up_set(GPU_SPACE, BASELINE_FULL), {}, taken, lambda c: None)
    assert after is not None and not after.why.startswith("recommended")
    memory_first = Situation(GPU_SPACE, BASELINE_FULL, "cuda", [METRICS[n] for n in PRESETS["memory"].objectives])
    assert next_queued(memory_first, [], {}, set(), lambda c: None) == memory  # memory leads: its stack first


def test_a_cpu_stack_keeps_the_baseline_dtype_and_compiles_without_cuda_graphs():
    cpu_space = GPU_SPACE.prune(PROFILES["cpu"].why_not_value)
    (speed,) = recommended_stacks(cpu_space, BASELINE_FULL, OBJECTIVES[:1], "throughput", "cpu")
    assert speed.config["dtype"] == BASELINE_FULL["dtype"]
    assert speed.config["compile"] == "default"  # reduce-overhead needs CUDA: the next preference
    (latency,) = recommended_stacks(cpu_space, BASELINE_FULL, [METRICS["tpot_s"]], "latency", "cpu")
    assert latency.why.startswith("recommended for latency") and latency.config["compile"] == "default"


def test_the_queue_never_drops_a_warm_up_change_and_runs_what_loses_the_first_objective_last(grid):
    plan = warm_up_set(GRID_SPACE, BASELINE)
    situation = Situation(GRID_SPACE, BASELINE, "cuda")
    done: list[dict] = [REFERENCE, BASELINE]
    roles = []
    while (planned := next_queued(situation, plan, measured_from(grid, done),
                                  {config_key(c) for c in done}, lambda config: None)) is not None:  # fmt: skip
        done.append(planned.config)
        roles.append(planned.why)
    keys = {config_key(c) for c in done}
    assert all(config_key(p.config) in keys for p in plan), "every warm-up change ran"
    assert roles[0].startswith("recommended for throughput")
    # the 4-bit stack is expected slower than the baseline: throughput leads, so it waits, and still runs
    memory_stack = next(i for i, why in enumerate(roles) if why.startswith("recommended for memory"))
    # bnb-8bit is expected slower on a GPU (its priors); the compile values are expected faster
    speed_losers = [i for i, why in enumerate(roles) if why == "warm-up: quantization=bnb-8bit"]
    compiled = [i for i, why in enumerate(roles) if why.startswith(("warm-up: compile=", "recommended for throughput"))]
    assert compiled and speed_losers and max(compiled) < min([*speed_losers, memory_stack]), roles
    assert len(done) < len(grid.trials), "then the sampler: the queue does not walk the whole grid"


# ----------------------------------------------------------------------------------------- replay


def figures(throughput: float, memory_gb: float, kl: float) -> dict[str, float]:
    return {"throughput_tok_s": throughput, "peak_memory_gb": memory_gb, "kl_divergence": kl}


def synthetic_grid(path: Path) -> Grid:
    """Every configuration of the CPU grid space with made-up but structured figures and durations."""
    speed = {"float32": 1.0, "bfloat16": 0.8, "float16": 0.7}
    memory = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}
    quant = {"none": (1.0, 1.0, 0.0), "bnb-8bit": (0.5, 0.6, 1e-3), "bnb-4bit": (0.4, 0.35, 2e-2)}
    trials = {}
    for config in GRID_SPACE.configurations():
        q_speed, q_memory, q_kl = quant[config["quantization"]]
        throughput = 1000 * speed[config["dtype"]] * q_speed * (2.0 if config.get("compile") == "default" else 1.0)
        throughput *= 0.5 if config["batching"] == "continuous" else 1.0
        kl = q_kl + (1e-4 if config["dtype"] != "float32" else 0.0)
        outcome = "oom" if config["batching"] == "continuous" and config.get("max_batch_tokens") == 1024 else "ok"
        trials[config_key(config)] = {
            "config": config,
            "outcome": outcome,
            "metrics": {} if outcome != "ok" else figures(throughput, memory[config["dtype"]] * q_memory, kl),
            "duration_s": 30.0 if config.get("compile") == "default" else 5.0,
        }
    path.write_text(json.dumps({"space": GRID_SPACE.to_json(), "trials": trials, "reference": REFERENCE,
                                "baseline": BASELINE}))  # fmt: skip
    return Grid.load(path)


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Grid:
    return synthetic_grid(tmp_path_factory.mktemp("grid") / "grid.json")


@pytest.mark.parametrize("strategy", ["random", "tpe", "nsga2"])
def test_a_full_replay_measures_each_configuration_once_and_ends_with_the_whole_grid(grid, strategy):
    curve = replay(grid, strategy, seed=0)
    assert len(curve.fractions) == len(grid.trials)
    assert curve.fractions[-1] == pytest.approx(1.0)
    assert all(a <= b + 1e-12 for a, b in zip(curve.fractions, curve.fractions[1:], strict=False))
    assert curve.seconds[-1] == pytest.approx(sum(t["duration_s"] for t in grid.trials.values()))


def test_replays_are_reproducible_per_seed_and_differ_between_seeds(grid):
    assert replay(grid, "random", seed=3).fractions == replay(grid, "random", seed=3).fractions
    assert replay(grid, "random", seed=3).fractions != replay(grid, "random", seed=4).fractions


def test_autotune_starts_with_reference_baseline_and_the_recommended_stacks(grid):
    curve = replay(grid, "autotune", seed=0, budget=4)
    assert len(curve.fractions) == 4
    assert curve.seconds == [5.0, 10.0, 40.0, 45.0]  # reference, baseline, bf16 + static + compile, 4-bit NF4


def test_autotune_skips_what_an_oom_rules_out(grid):
    # In the synthetic grid every 1024-token continuous configuration runs out of memory; once one has,
    # the heavier ones are skipped, so autotune's full replay launches fewer trials than the grid holds.
    full = replay(grid, "autotune", seed=0)
    assert len(full.fractions) < len(grid.trials)
    assert full.fractions[-1] == pytest.approx(1.0)  # and still finds the whole front


def test_time_to_a_fraction_and_the_comparison_over_budgets(grid):
    curve = replay(grid, "autotune", seed=0)
    assert curve.time_to(0.0) == curve.seconds[0]
    assert math.isinf(curve.time_to(1.5))
    runs = [replay(grid, "autotune", seed=s, budget=20) for s in range(3)]
    assert ahead_at_every_budget(grid, runs, runs)
