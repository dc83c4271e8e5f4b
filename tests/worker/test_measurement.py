"""The measurement: the timer against real sleeps, the arithmetic on known data, broken-output checks."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from autotune.space import Target, build_plan
from autotune.specs import WorkloadSpec
from autotune.worker.generation import PaddedGeneration, iteration_from_timestamps
from autotune.worker.measurement.quality.outputs import broken_reason, prefix_agreement
from autotune.worker.measurement.speed import (
    cost_per_million_tokens,
    decode_bytes_per_step,
    kv_bytes_per_token,
    roofline,
    speed_figures,
)


class SleepingModel:
    """Keeps generate()'s contract (stopping criteria called once per new token) but sleeps instead of computing."""

    device = torch.device("cpu")
    generation_config = SimpleNamespace(eos_token_id=None)

    def __init__(self, prefill_s: float, step_s: float) -> None:
        self.prefill_s = prefill_s
        self.step_s = step_s

    def generate(self, input_ids, max_new_tokens, stopping_criteria, **kwargs):
        new = torch.zeros(input_ids.shape[0], max_new_tokens, dtype=input_ids.dtype)
        time.sleep(self.prefill_s)
        for step in range(max_new_tokens):
            if step:
                time.sleep(self.step_s)
            stopping_criteria(input_ids, None)
        return torch.cat([input_ids, new], dim=1)


def test_generate_timer_measures_real_sleeps():
    prefill_s, step_s, batch, tokens = 0.05, 0.02, 4, 11
    plan = build_plan({"dtype": "float32"}, Target("cpu"))
    workload = PaddedGeneration(
        SleepingModel(prefill_s, step_s), plan, [[5] * 8] * batch, WorkloadSpec(output_len=tokens), pad_id=0
    )
    iteration = workload.run()
    # time.sleep never returns early, so the lower bounds hold exactly; the upper bounds allow for a busy machine.
    assert prefill_s <= iteration.ttft_s < prefill_s + 0.5
    assert len(iteration.gaps_s) == tokens - 1
    assert all(step_s <= gap < step_s + 0.5 for gap in iteration.gaps_s)
    assert batch / (step_s + 0.5) < iteration.decode_tok_s <= batch / step_s
    expected_elapsed = prefill_s + (tokens - 1) * step_s
    assert expected_elapsed <= iteration.elapsed_s < expected_elapsed + 1.0
    assert iteration.e2e_tok_s == pytest.approx(batch * tokens / iteration.elapsed_s)


def test_the_measured_generate_call_never_waits_for_the_device_between_tokens(cache_dir, monkeypatch):
    """The real demo model's generate(), timed as a trial times it: the clock marks every token, and every
    call that could wait for a device (the clock's own, torch.cuda's) happens before or after generate()."""
    from transformers import AutoTokenizer

    from autotune.specs import ModelSpec
    from autotune.worker.demo_model import ensure_demo_model
    from autotune.worker.generation import build_inputs
    from autotune.worker.loading import load_model
    from autotune.worker.measurement import token_clock

    path = str(ensure_demo_model(cache_dir))
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    spec = WorkloadSpec(batch_size=2, input_len=32, output_len=16)
    plan = build_plan({"dtype": "float32", "cache_implementation": "static"}, Target("cpu"))
    model = load_model(ModelSpec("demo", path=path), plan, "cpu")
    workload = PaddedGeneration(
        model, plan, build_inputs(tokenizer, spec, spec.batch_size), spec, tokenizer.pad_token_id
    )
    generating, waits = [False], []

    def spy(name, real):
        def wrapper(*args, **kwargs):
            waits.append((name, generating[0]))
            return real(*args, **kwargs)

        return wrapper

    def generate(**kwargs):
        generating[0] = True
        try:
            return real_generate(**kwargs)
        finally:
            generating[0] = False

    real_generate = model.generate
    monkeypatch.setattr(model, "generate", generate)
    monkeypatch.setattr(token_clock, "synchronize", spy("clock", token_clock.synchronize))
    for owner, name in ((torch.cuda, "synchronize"), (torch.cuda.Event, "synchronize"),
                        (torch.cuda.Event, "elapsed_time"), (torch.cuda.Stream, "synchronize")):  # fmt: skip
        monkeypatch.setattr(owner, name, spy(f"torch.cuda {name}", lambda *args, **kwargs: 0.0))
    iteration = workload.run()
    assert len(iteration.generated[0]) == 16 and len(iteration.gaps_s) == 15  # the clock marked every token
    assert waits == [("clock", False), ("clock", False)]  # once before the call, once after, none while it ran


def test_every_row_runs_to_the_workloads_length_with_the_end_of_sequence_check_a_deployment_runs(
    cache_dir, monkeypatch
):
    """The demo model is told its end of sequence is the token it generates first: generate() as deployed stops
    there, the workload goes on to its length, checking for the end of sequence at every token but processing no
    logits (min_new_tokens' processor is a cost a deployment does not have)."""
    from transformers import AutoTokenizer
    from transformers.generation import logits_process, stopping_criteria

    from autotune.specs import ModelSpec
    from autotune.worker.demo_model import ensure_demo_model
    from autotune.worker.generation import build_inputs
    from autotune.worker.loading import load_model

    path = str(ensure_demo_model(cache_dir))
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    spec = WorkloadSpec(batch_size=1, input_len=32, output_len=12)
    plan = build_plan({"dtype": "float32"}, Target("cpu"))
    model = load_model(ModelSpec("demo", path=path), plan, "cpu")
    workload = PaddedGeneration(
        model, plan, build_inputs(tokenizer, spec, spec.batch_size), spec, tokenizer.pad_token_id
    )
    first = workload.run().generated[0][0]
    model.generation_config.eos_token_id = first
    deployed = model.generate(input_ids=workload.input_ids, attention_mask=workload.attention_mask, max_new_tokens=12,
                              do_sample=False, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    assert deployed.shape[1] == 32 + 1  # a deployment stops at its end of sequence

    calls = {"eos check": 0, "logits processed": 0}

    def counted(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    eos_check = stopping_criteria.EosTokenCriteria.__call__
    monkeypatch.setattr(stopping_criteria.EosTokenCriteria, "__call__", counted("eos check", eos_check))
    processor = logits_process.MinNewTokensLengthLogitsProcessor.__call__
    monkeypatch.setattr(
        logits_process.MinNewTokensLengthLogitsProcessor, "__call__", counted("logits processed", processor)
    )
    generated = PaddedGeneration(
        model, plan, build_inputs(tokenizer, spec, spec.batch_size), spec, tokenizer.pad_token_id
    ).run()
    assert len(generated.generated[0]) == 12 and generated.generated[0][0] == first
    assert calls == {"eos check": 12, "logits processed": 0}


def test_continuous_batching_figures_from_known_timestamps():
    outputs = [
        SimpleNamespace(created_time=10.0, timestamps=[10.5, 11.0, 11.5], generated_tokens=[1, 2, 3]),
        SimpleNamespace(created_time=10.0, timestamps=[11.0, 11.5, 12.0, 12.5], generated_tokens=[4, 5, 6, 7]),
    ]
    iteration = iteration_from_timestamps(outputs, start=9.0, end=13.0)
    assert iteration.ttft_s == pytest.approx((0.5 + 1.0) / 2)
    assert iteration.decode_tok_s == pytest.approx((2 + 3) / (12.5 - 10.5))
    assert iteration.e2e_tok_s == pytest.approx(7 / 4.0)
    assert sorted(iteration.gaps_s) == [0.5] * 5
    assert iteration.generated == [[1, 2, 3], [4, 5, 6, 7]]


def test_speed_figures_report_medians_spread_and_repeats():
    def iteration(decode: float, elapsed: float):
        return SimpleNamespace(decode_tok_s=decode, e2e_tok_s=decode / 2, ttft_s=0.1, gaps_s=[0.01, 0.03],
                               elapsed_s=elapsed)  # fmt: skip

    iterations = [iteration(100, 1.0), iteration(110, 1.1), iteration(90, 0.9)]
    metrics, stats = speed_figures(iterations, first=iteration(50, 4.0))
    assert metrics["throughput_tok_s"] == 100
    assert metrics["iterations"] == 3
    assert metrics["throughput_cv"] == pytest.approx(10 / 100)
    assert metrics["compile_s"] == pytest.approx(3.0)
    assert stats["tpot_s"]["n"] == 6 and stats["tpot_s"]["p50"] == pytest.approx(0.02)
    assert set(stats) == {"throughput_tok_s", "e2e_throughput_tok_s", "ttft_s", "tpot_s", "iteration_s"}


def test_roofline_of_a_known_model():
    # Llama-2-7B: 32 layers, 32 key/value heads of 128 dims: 0.5 MiB of bfloat16 cache per token.
    kv = kv_bytes_per_token(layers=32, kv_heads=32, head_dim=128, element_bytes=2)
    assert kv == 524_288
    weights = 6.74e9 * 2  # 6.74 B parameters in bfloat16
    per_step = decode_bytes_per_step(weights, kv, requests=1, input_len=0, output_len=0)
    assert per_step == weights
    # 30 tokens/s at batch 1 reads the weights 30 times a second: 404 GB/s, 67% of an A10G's 600 GB/s.
    figures = roofline(decode_tok_s=30, requests=1, bytes_per_step=per_step, peak_gb_s=600)
    assert figures["achieved_bandwidth_gb_s"] == pytest.approx(404.4)
    assert figures["roofline_fraction"] == pytest.approx(0.674)
    # A batch of 8 at 128 + 64/2 tokens of context adds each request's cache to every step.
    per_step = decode_bytes_per_step(weights, kv, requests=8, input_len=128, output_len=64)
    assert per_step == pytest.approx(weights + 8 * 160 * 524_288)
    assert roofline(240, 8, per_step, 600)["achieved_bandwidth_gb_s"] == pytest.approx(per_step * 30 / 1e9)


def test_cost_per_million_tokens():
    # $1.01 an hour at 1000 tokens/s: 3.6 M tokens an hour, so $0.28 per million.
    assert cost_per_million_tokens(1.01, 1000) == pytest.approx(1.01 / 3.6)


def test_prefix_agreement():
    reference = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert prefix_agreement(reference, reference) == 1.0
    assert prefix_agreement([[1, 2, 9, 4], [0, 6, 7, 8]], reference) == pytest.approx((2 / 4 + 0) / 2)


def test_broken_outputs():
    reference = [[1, 2, 3], [4, 5, 6]]
    assert broken_reason([[1, 2, 3], [4, 5, 6]], reference) is None
    assert "empty" in broken_reason([[1, 2, 3], []], reference)
    assert "repeat one token (7)" in broken_reason([[7, 7, 7], [7, 7, 7]], reference)
    assert broken_reason([[7, 7, 7], [4, 5, 6]], reference) is not None  # half the continuations
    assert broken_reason([[7, 7, 7], [4, 5, 6], [1, 2, 3]], [*reference, [1, 2, 3]]) is None  # a third
    assert broken_reason([[7, 7, 7]], [[7, 7, 7]]) is None  # the reference repeats too: that is the model


# ----------------------------------------------------------------------------- real worker processes


def _measure(args: list[str], workdir, env) -> tuple[int, dict]:
    import json

    from tests.conftest import BRIEF, run_cli

    completed = run_cli(["measure", "--gpu", "cpu", "--json", *BRIEF, *args], workdir, env, timeout=600)
    assert completed.stdout.strip(), completed.stderr
    return completed.returncode, json.loads(completed.stdout)


@pytest.mark.slow
def test_measure_prints_every_figure_with_its_spread(tmp_path, cli_env):
    prompts = tmp_path / "uneven.jsonl"  # prompts of different lengths: generate() gets a left-padded batch
    prompts.write_text('{"prompt": "Blessed are the meek"}\n{"prompt": "In the beginning God created the heaven"}\n')
    code, document = _measure(
        ["--model", "demo", "--set", "dtype=bfloat16", "--set", "attn_implementation=sdpa", "--batch-size", "4",
         "--input-len", "64", "--output-len", "32", "--prompts", str(prompts)], tmp_path, cli_env)  # fmt: skip
    assert code == 0 and document["outcome"] == "ok"
    assert document["config"]["dtype"] == "bfloat16" and document["config"]["cache_implementation"] == "dynamic"
    metrics, stats = document["metrics"], document["stats"]
    for name in ("throughput_tok_s", "e2e_throughput_tok_s", "ttft_s", "tpot_s"):
        assert set(stats[name]) >= {"p50", "p95", "cv", "n"} and stats[name]["n"] >= 5
    assert metrics["iterations"] >= 5
    assert 0 < metrics["roofline_fraction"] < 1 and metrics["cost_per_million_tokens_usd"] > 0
    assert metrics["weight_bytes"] == pytest.approx(2 * 1_049_728, rel=0.01)  # the demo's parameters in bf16
    assert 0 < metrics["greedy_agreement"] <= 1 and metrics["kl_divergence"] > 0
    assert document["environment"]["torch"] and document["environment"]["transformers"]
    assert {"startup", "load", "warmup", "measure", "quality", "wall"} <= set(document["timings"])


@pytest.mark.slow
def test_latency_workload_with_own_prompts(tmp_path, cli_env):
    prompts = tmp_path / "mine.txt"
    prompts.write_text("Blessed are the meek\nThe LORD is my shepherd; I shall not want.\n")
    code, document = _measure(
        ["--model", "demo", "--workload", "latency", "--prompts", str(prompts), "--output-len", "16"],
        tmp_path,
        cli_env,
    )
    assert code == 0, document["message"]
    assert document["workload"]["kind"] == "latency" and document["workload"]["batch_size"] == 1  # what ran
    assert document["stats"]["tpot_s"]["n"] >= 5 * 15  # every token gap of every iteration, one request
    assert 0 <= document["metrics"]["greedy_agreement"] <= 1


@pytest.mark.slow
def test_a_configuration_that_overflows_in_float16_is_broken(tmp_path, cli_env, cache_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from autotune.worker.demo_model import ensure_demo_model

    demo = ensure_demo_model(cache_dir)
    model = AutoModelForCausalLM.from_pretrained(demo, dtype=torch.float32)
    with torch.no_grad():  # activations beyond float16's 65504, harmless in float32 thanks to RMSNorm
        model.model.layers[0].mlp.down_proj.weight.mul_(1e5)
    model.save_pretrained(tmp_path / "overflowing")
    AutoTokenizer.from_pretrained(demo).save_pretrained(tmp_path / "overflowing")

    code, document = _measure(["--model", str(tmp_path / "overflowing"), "--set", "dtype=float32",
                               "--output-len", "16"], tmp_path, cli_env)  # fmt: skip
    assert code == 0, document["message"]
    code, document = _measure(["--model", str(tmp_path / "overflowing"), "--set", "dtype=float16",
                               "--output-len", "16"], tmp_path, cli_env)  # fmt: skip
    assert code == 1
    assert document["outcome"] == "broken"
    assert "NaN or infinite" in document["message"] or "repeat one token" in document["message"]
    assert document["metrics"] == {}
