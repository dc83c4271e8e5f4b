"""The use_kernels knob: from_pretrained(use_kernels=True); a trial whose layers run no hub kernel is unsupported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.measure.prepare import baseline_config
from autotune.paths import PACKAGED_SPACE
from autotune.process.results import Outcome
from autotune.profiles import PROFILES
from autotune.report.snippets import python_snippet, serve_command
from autotune.space import Plan, Target, build_plan, load_space
from autotune.space.plan import WorkerHook
from autotune.specs import ModelSpec

BASE = {"dtype": "float32", "attn_implementation": "eager", "quantization": "none", "batching": "generate"}
SPACE = load_space(PACKAGED_SPACE)
NO_KERNEL_ON_CPU = (
    "no hub kernel could be fetched for any layer: 0 of 13 kernel-capable layers (RMSNorm, SiLU) run one on cpu; "
    "transformers maps none of them to a cpu kernel"
)


def test_on_loads_with_use_kernels_and_off_is_the_baseline():
    plan = build_plan({**BASE, "use_kernels": "on"}, Target("cuda"))
    assert plan.load["use_kernels"] is True
    assert plan.worker_hooks == {"use_kernels": WorkerHook("autotune.worker.hub_kernels", "on")}  # its check, found
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert build_plan({**BASE, "use_kernels": "off"}, Target("cuda")) == build_plan(BASE, Target("cuda"))
    assert baseline_config(SPACE, "float32", PROFILES["cpu"], "throughput", "sdpa")["use_kernels"] == "off"


def test_the_snippet_loads_with_use_kernels_and_serve_says_it_has_no_flag():
    plan = build_plan({**BASE, "use_kernels": "on"}, Target("cuda"))
    assert "use_kernels=True" in python_snippet("org/model", plan, "cuda", 16)
    assert "use_kernels=on" in serve_command("org/model", plan, "cuda").splitlines()[1]


def test_the_worker_check_blames_use_kernels_even_beside_a_rare_attention():
    from autotune.worker.failures import UnsupportedError, classify

    classified = classify(UnsupportedError(NO_KERNEL_ON_CPU, knob="use_kernels"), {**BASE, "use_kernels": "on"})
    assert (classified.outcome, classified.knob, classified.certain) == (Outcome.UNSUPPORTED, "use_kernels", True)


def test_a_model_whose_layers_all_fell_back_is_unsupported_with_the_reason(cache_dir: Path):
    from autotune.worker.demo_model import ensure_demo_model
    from autotune.worker.failures import UnsupportedError
    from autotune.worker.loading import load_model

    demo_model_path = ensure_demo_model(cache_dir)
    plan = build_plan({**BASE, "use_kernels": "on"}, Target("cpu"))
    with pytest.raises(UnsupportedError) as raised:
        load_model(ModelSpec(id="demo", path=str(demo_model_path)), plan, "cpu")
    assert str(raised.value) == NO_KERNEL_ON_CPU


def test_a_stored_plan_can_name_no_hook_outside_the_worker():
    from autotune.worker import hooks

    plan = build_plan({**BASE, "use_kernels": "on"}, Target("cpu"))
    plan.worker_hooks["use_kernels"] = WorkerHook("os", "on")
    with pytest.raises(ValueError, match=r"not a module of autotune\.worker\."):
        hooks.before_load(plan)


# The real run of use_kernels=on, unsupported with this reason, is a conformance case (benchmarks/conformance/).
