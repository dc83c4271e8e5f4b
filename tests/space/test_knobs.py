"""What each knob handler says about itself, and that the study and the worker read it from the registry."""

from __future__ import annotations

import ast
import json
import re

import pytest

from autotune.cli.printers import knobs_line
from autotune.measure.prepare import _with_defaults
from autotune.paths import PACKAGED_SPACE
from autotune.process.results import Outcome
from autotune.report.snippets import json_snippet, python_snippet
from autotune.space import KNOBS, Call, Plan, Ref, Target, build_plan, load_space, parse_space
from autotune.space.knobs import knob_defaults, short_name
from autotune.strategy.durations import Durations
from autotune.strategy.forecast import Forecaster
from autotune.strategy.queue import ruled_out
from autotune.worker.failures import classify

BASELINE = {"dtype": "bfloat16", "attn_implementation": "sdpa", "quantization": "none", "batching": "generate"}


def test_the_defaults_are_what_transformers_does_with_no_arguments():
    """A plan of every default passes nothing to from_pretrained, generate or serve."""
    defaults = knob_defaults()
    assert defaults, "some knob has a default"
    assert all(KNOBS[name].accepts(value) for name, value in defaults.items())
    plan = build_plan(defaults, Target("cpu"))
    assert (plan.load, plan.generate, plan.continuous, plan.serve_flags, plan.not_servable) == ({}, {}, {}, [], [])
    assert plan.batching == Plan().batching


def test_knobs_whose_default_depends_on_the_model_have_none():
    assert KNOBS["dtype"].default is None  # the checkpoint's
    assert KNOBS["attn_implementation"].default is None  # what transformers picks for the architecture


def test_memory_ordered_knobs_rank_every_value_they_take():
    ordered = [knob for knob in KNOBS.values() if knob.orders_memory()]
    assert {"dtype", "quantization", "max_batch_tokens"} <= {knob.name for knob in ordered}
    for knob in ordered:
        for value in knob.choices or (256, 2048):
            assert isinstance(knob.memory_rank(value), int), (knob.name, value)
    assert KNOBS["dtype"].memory_rank("float32") > KNOBS["dtype"].memory_rank("bfloat16")
    assert KNOBS["quantization"].memory_rank("bnb-4bit") < KNOBS["quantization"].memory_rank("bnb-8bit")
    assert KNOBS["max_batch_tokens"].memory_rank(2048) > KNOBS["max_batch_tokens"].memory_rank(256)
    assert KNOBS["cache_implementation"].memory_rank("static") is None  # not ordered: an OOM says nothing of it


@pytest.mark.parametrize("name", [name for name, knob in KNOBS.items() if knob.memory_ranks])
def test_an_oom_rules_out_the_heavier_values_of_each_ranked_knob(name):
    knob = KNOBS[name]
    by_memory = sorted(knob.memory_ranks, key=lambda value: knob.memory_ranks[value])
    lightest, heaviest = by_memory[0], by_memory[-1]
    history = [(3, {**BASELINE, name: lightest}, Outcome.OOM)]
    assert "trial #3" in (ruled_out({**BASELINE, name: heaviest}, history) or "")
    assert ruled_out({**BASELINE, name: heaviest}, [(3, {**BASELINE, name: heaviest}, Outcome.OOM)]) is not None
    assert ruled_out({**BASELINE, name: lightest}, [(3, {**BASELINE, name: heaviest}, Outcome.OOM)]) is None


def test_every_value_states_what_the_guides_lead_one_to_expect_on_each_device():
    for knob in KNOBS.values():
        for value in knob.choices or ():
            for device in ("cpu", "cuda"):
                expectation = knob.expect(value, device)
                assert expectation.speed > 0 and expectation.memory > 0 and expectation.time >= 1, (knob.name, value)
                assert expectation.spread > 0
    # static cache + compile: a large gain on CUDA, slow to measure; bnb-8bit: about half the memory, slower
    compiled = KNOBS["compile"].expect("reduce-overhead", "cuda")
    assert compiled.speed >= 3 and compiled.time > KNOBS["batching"].expect("continuous", "cuda").time
    eight_bit, four_bit = (KNOBS["quantization"].expect(v, "cuda") for v in ("bnb-8bit", "bnb-4bit"))
    assert eight_bit.speed < 1 and 0.4 < eight_bit.memory < 0.7 and four_bit.memory < eight_bit.memory
    assert KNOBS["dtype"].expect("bfloat16", "cuda").memory < 0.6  # half the weight bytes of float32


def test_a_trial_compiling_is_expected_to_take_longest_before_any_ran():
    forecaster = Forecaster(load_space(PACKAGED_SPACE), BASELINE, "cuda", measured={})
    compiled = {**BASELINE, "cache_implementation": "static", "compile": "default"}
    continuous = {**BASELINE, "batching": "continuous"}
    assert forecaster.seconds(compiled) > forecaster.seconds(continuous) > forecaster.seconds(BASELINE) == 1.0


def test_trials_that_compile_batch_and_quantize_alike_are_expected_to_take_alike():
    compiled = {**BASELINE, "cache_implementation": "static", "compile": "default"}
    ended = [(compiled, 60.0), (BASELINE, 10.0), ({**BASELINE, "quantization": "bnb-8bit"}, 30.0)]
    durations = Durations(ended, BASELINE, "cuda")
    assert durations.of(compiled).alike and durations.of(compiled).expected == 60.0
    assert durations.of({**BASELINE, "dtype": "float32"}).expected == 10.0  # dtype does not matter
    assert durations.of({**BASELINE, "quantization": "bnb-8bit"}).expected == 30.0
    assert not durations.of({**compiled, "compile": "max-autotune"}).alike  # each compile mode takes its own time


@pytest.mark.parametrize("name", [name for name, knob in KNOBS.items() if knob.failure_words])
def test_each_knobs_failure_words_blame_it_when_it_is_set_off_its_default(name):
    knob = KNOBS[name]
    unusual = next(value for value in knob.choices or () if value not in knob.usual_values())
    for word in knob.failure_words:
        classified = classify(ImportError(f"this needs the {word} package"), {**BASELINE, name: unusual})
        assert (classified.outcome, classified.knob) == (Outcome.UNSUPPORTED, name), word
    at_default = classify(ImportError(f"needs {knob.failure_words[0]}"), {**BASELINE, name: knob.default or "sdpa"})
    assert at_default.knob is None


def test_a_refusal_blames_its_knob_whatever_the_value():
    refusal = ValueError("GPTJForCausalLM does not support an attention implementation through sdpa yet")
    refusing = [name for name, knob in KNOBS.items() if knob.refusals]
    assert refusing == ["attn_implementation", "kv_cache_backend"]
    assert classify(refusal, BASELINE).knob == "attn_implementation"
    assert classify(refusal, {"dtype": "float32"}).knob is None  # the knob is not set: nothing to exclude


def test_short_names_are_unique_and_used_in_trial_lines():
    labels = [short_name(name) for name in KNOBS]
    assert len(set(labels)) == len(labels)
    assert short_name("attn_implementation") == "attn" and short_name("dtype") == "dtype"
    assert short_name("not_a_knob") == "not_a_knob"
    assert knobs_line({"attn_implementation": "sdpa", "quantization": "none"}) == "attn=sdpa quant=none"


def test_the_plan_says_which_workload_measures_it_and_old_plans_still_load():
    assert build_plan(BASELINE, Target("cpu")).workload == "throughput"
    assert build_plan(BASELINE, Target("cpu", workload="serve")).workload == "serve"
    plan = build_plan({**BASELINE, "workload": "latency"}, Target("cpu", workload="serve"))  # the knob wins
    assert plan.workload == "latency" and "latency" not in plan.serve_flags  # measured so, deployed the same
    assert Plan.from_json(plan.to_json()) == plan
    stored_before = {key: value for key, value in plan.to_json().items() if key != "workload"}
    assert Plan.from_json(stored_before).workload is None  # the worker then takes the study's workload


def test_the_plan_says_whether_generate_compiles_and_whether_the_kv_cache_is_quantized():
    static = {**BASELINE, "cache_implementation": "static"}
    assert build_plan({**static, "compile": "default"}, Target("cpu")).compiles
    assert not build_plan({**static, "compile": "off"}, Target("cpu")).compiles
    assert build_plan({**BASELINE, "cache_implementation": "quantized"}, Target("cpu")).quantized_kv_cache
    assert not build_plan(static, Target("cpu")).quantized_kv_cache


MATH_ONLY = Call("torch.nn.attention.sdpa_kernel", {"backends": Ref("torch.nn.attention.SDPBackend.MATH")})


def test_a_plans_contexts_are_entered_around_generate_in_the_snippet_outermost_first():
    plan = build_plan({**BASELINE, "execution_mode": "inference_mode"}, Target("cpu"))
    plan.contexts.append(MATH_ONLY)
    code = python_snippet("org/model", plan, "cpu", 8)
    ast.parse(code)
    header = "with torch.inference_mode(), torch.nn.attention.sdpa_kernel(backends=torch.nn.attention.SDPBackend.MATH):"
    assert code.startswith("import torch\n") and f"\n{header}\n    outputs = model.generate(\n" in code
    assert json.loads(json_snippet("org/model", {}, plan))["contexts"] == [
        {"class": "torch.inference_mode"},
        {"class": "torch.nn.attention.sdpa_kernel", "backends": "torch.nn.attention.SDPBackend.MATH"},
    ]
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_a_context_from_the_plan_is_the_real_one_and_an_enum_member_resolves():
    import torch

    from autotune.worker.loading import materialize

    assert materialize(Ref("torch.nn.attention.SDPBackend.MATH")) is torch.nn.attention.SDPBackend.MATH
    flash_before = torch.backends.cuda.flash_sdp_enabled()
    with materialize(MATH_ONLY):
        assert torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled() == flash_before


def test_continuous_batching_refuses_a_plan_with_contexts_it_cannot_reach():
    from autotune.worker.failures import UnsupportedError
    from autotune.worker.generation_trial import refuse_what_cannot_run

    config = {**BASELINE, "batching": "continuous"}
    plan = build_plan(config, Target("cpu"))
    plan.contexts.append(MATH_ONLY)
    with pytest.raises(UnsupportedError, match="its own thread") as refused:
        refuse_what_cannot_run(config, plan)
    assert refused.value.combination  # no single knob value is to blame


def test_the_reference_gets_the_defaults_of_knobs_its_picked_attention_makes_apply():
    only_with_sdpa = {"values": ["inference_mode", "no_grad"], "when": {"attn_implementation": "sdpa"}}
    knobs = {"dtype": ["float32"], "attn_implementation": ["sdpa", "eager"], "execution_mode": only_with_sdpa}
    space = parse_space({"knobs": knobs}, "test")
    found = {"dtype": "float32", "attn_implementation": "sdpa"}  # the worker added the attention it picked
    assert _with_defaults(space, found) == {**found, "execution_mode": "no_grad"}
    assert _with_defaults(space, {**found, "attn_implementation": "eager"}) == {**found, "attn_implementation": "eager"}


def test_every_recipe_names_registered_knobs_and_values_they_take():
    from autotune.space.knobs import FLASH, RECIPES

    assert set(RECIPES) == {"throughput", "latency", "memory", "serve"}
    for recipe in RECIPES.values():
        for name, values in recipe.settings:
            assert all(value == FLASH or KNOBS[name].accepts(value) for value in values), (recipe.aim, name)


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ((("compiler", ("default",)),), "recipe 'broken' sets compiler, which is no registered knob"),
        ((("compile", ("fastest",)),), "recipe 'broken': knob compile has no value 'fastest'; it takes off, default"),
    ],
)
def test_a_recipe_with_an_unknown_knob_or_value_is_refused(settings, error):
    from autotune.space.knobs import RECIPES, Recipe, check_recipes

    broken = Recipe("broken", "a stack", settings, "nowhere")
    with pytest.raises(ValueError, match=re.escape(error)):
        check_recipes({**RECIPES, "broken": broken}, KNOBS)
