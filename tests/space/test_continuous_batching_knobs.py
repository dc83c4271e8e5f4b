"""Continuous batching's knobs: page_size, use_cuda_graph, use_async_batching, and the attention it runs."""

from __future__ import annotations

import importlib
import inspect
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from autotune.paths import PACKAGED_SPACE
from autotune.process.results import Outcome
from autotune.profiles import PROFILES
from autotune.space import KNOBS, Plan, Target, build_plan, load_space
from autotune.worker import compat, generation
from autotune.worker.failures import UnsupportedError, classify
from tests.conftest import run_main

CONTINUOUS = {"dtype": "float32", "attn_implementation": "sdpa", "batching": "continuous", "max_batch_tokens": 256}
SPACE = load_space(PACKAGED_SPACE)
TARGET = Target("cuda", requests=8, tokens_per_request=192)


def _flag_value(flags: list[str], flag: str) -> str:
    assert flags.count(flag) == 1, flags
    return flags[flags.index(flag) + 1]


def test_the_page_size_resizes_the_page_count_from_the_workload():
    for page_size, pages_per_request in ((16, 12), (32, 6), (64, 3)):
        plan = build_plan({**CONTINUOUS, "page_size": page_size}, TARGET)
        num_blocks = 8 * pages_per_request + 2  # every request's pages, and two spare
        assert (plan.continuous["page_size"], plan.continuous["num_blocks"]) == (page_size, num_blocks)
        assert _flag_value(plan.serve_flags, "--cb-block-size") == str(page_size)
        assert _flag_value(plan.serve_flags, "--cb-num-blocks") == str(num_blocks)
        assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert build_plan({**CONTINUOUS, "page_size": 32}, TARGET) == build_plan(CONTINUOUS, TARGET)
    assert KNOBS["page_size"].accepts(4) and not KNOBS["page_size"].accepts(3)


def test_the_installed_transformers_takes_the_plans_options():
    plan = build_plan({**CONTINUOUS, "page_size": 16, "use_cuda_graph": "on", "use_async_batching": "off"}, TARGET)
    config = compat.continuous_batching_config(plan.continuous)
    assert (config.page_size, config.num_blocks) == (16, 98)
    assert (config.use_cuda_graph, config.use_async_batching) == (True, False)


def test_the_switches_set_transformers_options_only_when_forced():
    auto = build_plan({**CONTINUOUS, "use_cuda_graph": "auto", "use_async_batching": "auto"}, TARGET)
    assert auto == build_plan(CONTINUOUS, TARGET)
    for value, flag in (("on", "--cb-use-cuda-graph"), ("off", "--no-cb-use-cuda-graph")):
        plan = build_plan({**CONTINUOUS, "use_cuda_graph": value}, TARGET)
        assert plan.continuous["use_cuda_graph"] is (value == "on")
        assert flag in plan.serve_flags and not plan.not_servable
    for value in ("on", "off"):
        plan = build_plan({**CONTINUOUS, "use_async_batching": value}, TARGET)
        assert plan.continuous["use_async_batching"] is (value == "on")
        assert plan.not_servable == [f"use_async_batching={value} (serve has no flag for it)"]


def test_the_serve_flags_are_the_installed_transformers_serve_options():
    from transformers.cli.serve import Serve

    options = inspect.signature(Serve.__init__).parameters
    assert {"cb_block_size", "cb_num_blocks", "cb_use_cuda_graph"} <= set(options)
    assert not any("async" in name for name in options)  # hence use_async_batching is not servable


def test_they_apply_only_under_continuous_batching():
    knobs = {"page_size": 16, "use_cuda_graph": "auto", "use_async_batching": "auto"}
    generate = SPACE.normalize({**CONTINUOUS, "batching": "generate", **knobs})
    assert not set(knobs) & set(generate)
    continuous = SPACE.normalize({**CONTINUOUS, **knobs})
    assert {name: continuous[name] for name in knobs} == knobs and SPACE.violation(continuous) is None


def test_on_cpu_only_auto_is_left_each_value_removed_with_its_reason():
    cpu = SPACE.prune(PROFILES["cpu"].why_not_value)
    assert cpu.knob("use_cuda_graph").values == ("auto",) == cpu.knob("use_async_batching").values
    assert "no-op" in cpu.removed["use_cuda_graph"]["on"]
    assert "refuses" in cpu.removed["use_async_batching"]["on"]
    assert "only on CUDA" in cpu.removed["use_cuda_graph"]["off"]
    assert cpu.knob("page_size").values == (16, 32, 64)
    h100 = SPACE.prune(PROFILES["h100"].why_not_value)
    assert h100.knob("use_cuda_graph").values == ("auto", "on", "off") == h100.knob("use_async_batching").values


def test_an_out_of_memory_rules_out_only_what_needs_at_least_as_much():
    from autotune.strategy.queue import ruled_out

    def config(**knobs: object) -> dict[str, object]:
        return {**CONTINUOUS, "page_size": 32, "use_cuda_graph": "auto", "use_async_batching": "auto", **knobs}

    history = [(3, config(use_async_batching="auto"), Outcome.OOM)]
    assert ruled_out(config(use_async_batching="on"), history)
    assert ruled_out(config(use_async_batching="off"), history) is None  # auto may have been on
    assert ruled_out(config(page_size=64), history) and ruled_out(config(page_size=16), history) is None


def test_continuous_batching_runs_the_paged_form_of_the_loaded_attention():
    for loaded, running in (("eager", "paged|eager"), ("sdpa", "sdpa"), ("sdpa", "paged|sdpa")):
        generation.check_attention_kept(loaded, running)
    with pytest.raises(UnsupportedError, match="switched continuous batching from sdpa attention to flash") as error:
        generation.check_attention_kept("sdpa", "flash_attention_2")
    classified = classify(error.value, CONTINUOUS)
    assert (classified.outcome, classified.knob) == (Outcome.UNSUPPORTED, None)  # sdpa runs without it


@dataclass
class ContinuousBatchingConfig517:
    """ContinuousBatchingConfig of transformers 5.17: no auto_switch_to_flash (the fields used here)."""

    block_size: int = 256


def test_without_auto_switch_to_flash_the_attention_is_pinned_as_paged_and_restored(monkeypatch, cache_dir):
    from transformers import AutoModelForCausalLM

    from autotune.worker.demo_model import ensure_demo_model

    # eager: the installed version (5.22+) keeps paged|eager as it is, and paged|sdpa only as sdpa
    model = AutoModelForCausalLM.from_pretrained(ensure_demo_model(cache_dir), attn_implementation="eager")
    kwargs = build_plan({**CONTINUOUS, "attn_implementation": "eager"}, Target("cpu")).continuous
    assert compat.pin_attention(model, kwargs) is None  # the installed version has the option
    installed = importlib.import_module("transformers")
    monkeypatch.setattr(installed, "ContinuousBatchingConfig", ContinuousBatchingConfig517)
    assert compat.pin_attention(model, kwargs) == "eager"
    assert model.config._attn_implementation == "paged|eager"  # 5.17 switches a paged attention to nothing else
    assert compat.pin_attention(model, kwargs) is None


def test_the_manager_gets_the_page_size_and_gives_the_attention_back(cache_dir):
    from transformers import AutoModelForCausalLM

    from autotune.specs import WorkloadSpec
    from autotune.worker.demo_model import ensure_demo_model
    from autotune.worker.generation import ContinuousGeneration

    model = AutoModelForCausalLM.from_pretrained(ensure_demo_model(cache_dir), attn_implementation="eager")
    plan = build_plan({**CONTINUOUS, "attn_implementation": "eager", "page_size": 16}, Target("cpu", 2, 24))
    spec = WorkloadSpec(batch_size=2, input_len=16, output_len=8)
    workload = ContinuousGeneration(model, plan, [[5] * 16, [7] * 16], spec)
    try:
        assert model.config._attn_implementation == "paged|eager"
        config = workload.manager.continuous_batching_config
        assert (config.page_size, config.num_blocks) == (16, 2 * 2 + 2)
        assert [len(tokens) for tokens in workload.run().generated] == [8, 8]
    finally:
        workload.close()
    assert model.config._attn_implementation == "eager"


def test_measure_refuses_cuda_graphs_on_cpu(tmp_path: Path, cli_env: dict[str, str]) -> None:
    args = ["measure", "--model", "demo", "--device", "cpu", "--set", "batching=continuous",
            "--set", "max_batch_tokens=256", "--set", "use_cuda_graph=on"]  # fmt: skip
    completed = run_main(args, tmp_path, cli_env)
    assert completed.returncode == 2 and "Traceback" not in completed.stderr
    expected = (
        "use_cuda_graph=on is not measured on profile cpu: "
        "needs a CUDA GPU (CUDA graphs need CUDA: elsewhere transformers turns them off, a no-op)"
    )
    assert completed.stderr == f"autotune: error: {expected}\n"


# A real run with small pages (page_size=16, the continuous baseline's) and with each other page size is a
# conformance case (benchmarks/conformance/), measured once per CI run per transformers version.
