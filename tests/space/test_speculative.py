"""The speculative knobs: prompt lookup, a draft model, early exit; lossless under greedy, batch size 1 only."""

from __future__ import annotations

import ast
import json

import pytest

from autotune.paths import PACKAGED_SPACE
from autotune.profiles import PROFILES
from autotune.report.snippets import python_snippet
from autotune.space import Call, Plan, Target, build_plan, load_space
from autotune.worker.failures import UnsupportedError

BASE = {"dtype": "float32", "attn_implementation": "sdpa", "quantization": "none", "batching": "generate"}
SPACE = load_space(PACKAGED_SPACE)
DRAFT = "/models/draft"
WITH_DRAFT = Target("cpu", assistant_model=DRAFT)


def test_each_value_is_one_generate_argument_and_none_is_the_baseline():
    assert build_plan({**BASE, "speculative": "none"}, WITH_DRAFT) == build_plan(BASE, WITH_DRAFT)
    lookup = build_plan({**BASE, "speculative": "prompt_lookup"}, WITH_DRAFT).generate
    assert lookup == {"prompt_lookup_num_tokens": 10}
    assistant = build_plan({**BASE, "speculative": "assistant"}, WITH_DRAFT).generate["assistant_model"]
    assert assistant == Call(
        "transformers.AutoModelForCausalLM.from_pretrained",
        {
            "pretrained_model_name_or_path": DRAFT,
            "dtype": build_plan(BASE, WITH_DRAFT).load["dtype"],
            "device_map": "cpu",
        },
    )
    assert build_plan({**BASE, "speculative": "early_exit"}, WITH_DRAFT).generate == {"assistant_early_exit": 2}


def test_speculated_tokens_and_the_exit_layer_go_to_the_argument_of_the_method():
    def generate(**config: object) -> dict:
        return build_plan({**BASE, **config}, WITH_DRAFT).generate

    assert generate(speculative="prompt_lookup", speculative_tokens=3) == {"prompt_lookup_num_tokens": 3}
    assert generate(speculative="assistant", speculative_tokens=5)["num_assistant_tokens"] == 5
    early = generate(speculative="early_exit", speculative_tokens=3, early_exit_layer=1)
    assert early == {"assistant_early_exit": 1, "num_assistant_tokens": 3}


def test_the_plan_round_trips_and_the_snippet_loads_the_draft():
    plan = build_plan({**BASE, "speculative": "assistant", "speculative_tokens": 5}, WITH_DRAFT)
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    code = python_snippet("org/model", plan, "cpu", 16)
    ast.parse(code)
    assert "assistant_model=AutoModelForCausalLM.from_pretrained(" in code and DRAFT in code
    assert "num_assistant_tokens=5" in code
    assert any(line.startswith("speculative=assistant") for line in plan.not_servable)


def test_assistant_without_a_draft_model_is_unsupported_with_what_to_give():
    from autotune.worker.failures import classify
    from autotune.worker.generation_trial import refuse_what_cannot_run

    config = {**BASE, "speculative": "assistant"}
    plan = build_plan(config, Target("cpu"))
    with pytest.raises(UnsupportedError, match="give --assistant-model") as refused:
        refuse_what_cannot_run(config, Plan.from_json(plan.to_json()))
    assert classify(refused.value, config).certain  # excluded for the study: no draft model will appear


def test_the_space_gives_tokens_only_to_a_method_and_forbids_continuous_batching():
    assert SPACE.normalize({**BASE, "speculative": "none", "speculative_tokens": 5}).get("speculative_tokens") is None
    lookup = SPACE.normalize({**BASE, "cache_implementation": "dynamic", "speculative": "prompt_lookup",
                              "speculative_tokens": 5})  # fmt: skip
    assert lookup["speculative_tokens"] == 5 and "early_exit_layer" not in lookup
    assert SPACE.violation(lookup) is None
    continuous = SPACE.normalize({**BASE, "batching": "continuous", "max_batch_tokens": 256,
                                  "speculative": "prompt_lookup", "speculative_tokens": 5})  # fmt: skip
    assert "assisted decoding" in (SPACE.violation(continuous) or "")


def test_the_batch_size_refusal_blames_the_knob():
    from autotune.worker.failures import classify

    error = ValueError("assisted generate is only supported for batch_size = 1")
    classified = classify(error, {**BASE, "speculative": "prompt_lookup"})
    assert classified.outcome.value == "unsupported" and classified.knob == "speculative"


# Each method's real run, lossless under greedy decoding (greedy agreement 1, KL < 1e-6, float32), and transformers'
# refusal of a batch are conformance cases (benchmarks/conformance/), measured once per CI run per version.


def test_a_search_of_batches_never_plans_speculative_decoding():
    from autotune.measure.prepare import runnable_space

    batches = runnable_space(SPACE, PROFILES["cpu"], Target("cpu", requests=8))
    assert batches.knob("speculative").values == ("none",)
    assert "one prompt at a time" in batches.removed["speculative"]["prompt_lookup"]
    single = runnable_space(SPACE, PROFILES["cpu"], Target("cpu", requests=1))
    assert single.knob("speculative").values == ("none", "prompt_lookup", "assistant", "early_exit")


def test_a_latency_search_plans_for_one_prompt_at_a_time_whatever_its_batch_size():
    from autotune.measure.prepare import plan_target
    from autotune.specs import ModelSpec, SearchRequest, WorkloadSpec

    def requests(kind: str) -> int:
        request = SearchRequest(ModelSpec("demo"), workload=WorkloadSpec(kind, batch_size=8))
        return plan_target(PROFILES["cpu"], request).requests

    assert (requests("latency"), requests("throughput")) == (1, 8)
