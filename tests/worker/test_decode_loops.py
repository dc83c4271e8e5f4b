"""autotune's decoding loops (autotune/worker/decode_loops.py) give stock generate()'s output through
generate(custom_generate=...): under greedy search token for token, with an end of sequence in the middle of a batch
or ending every row early, left padding, one row and many, dynamic and static caches, compiled or not, float32 and
bfloat16, with the length reached or not; under sampling the same tokens from the same seed (the same draws from the
same distributions); with logits processors, scores and logits in the output. And they read the device
from the host every few tokens, not after each: the profiler counts it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.worker.decode_loops import LOOPS
from autotune.worker.fused_step import KEPT_CACHE, KEPT_STEPS

PROMPTS = ("The quick brown fox", "Once upon a time in a land far away there", "A", "In the beginning the model was")
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def demo(cache_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoTokenizer

    from autotune.worker.demo_model import ensure_demo_model

    path = ensure_demo_model(cache_dir)
    return path, AutoTokenizer.from_pretrained(path, padding_side="left")


def load(demo: tuple[Any, Any], dtype: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(demo[0], dtype=getattr(torch, dtype)).eval()


def generate(model: Any, tokenizer: Any, loop: str, rows: int, cache: str, compiled: bool, **extra: Any) -> Any:
    """generate() on `rows` left-padded prompts, through `loop` (generate: its own loop)."""
    from transformers import CompileConfig

    inputs = tokenizer(list(PROMPTS * 2)[:rows], return_tensors="pt", padding=True)
    kwargs: dict[str, Any] = {"max_new_tokens": NEW_TOKENS, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}
    if cache != "dynamic":
        kwargs["cache_implementation"] = cache
        if compiled:
            kwargs["compile_config"] = CompileConfig(mode="default")
            kwargs["compile_config"]._compile_all_devices = True  # generate() compiles on a CPU only when told
        else:
            kwargs["disable_compile"] = True
    kwargs |= extra
    if loop != "generate":
        kwargs["custom_generate"] = LOOPS[loop]
    if kwargs["do_sample"]:
        torch.manual_seed(0)
    return model.generate(**inputs, **kwargs)


def assert_same(output: Any, expected: Any, what: str) -> None:
    if isinstance(expected, torch.Tensor):
        assert output.shape == expected.shape and torch.equal(output, expected), what
        return
    assert_same(output.sequences, expected.sequences, what)
    for field in ("scores", "logits"):
        got, wanted = getattr(output, field), getattr(expected, field)
        assert (got is None) == (wanted is None), f"{what}: {field}"
        if wanted is not None:
            assert len(got) == len(wanted) and all(map(torch.equal, got, wanted)), f"{what}: {field}"


def end_of_sequence_cases(reference: torch.Tensor) -> dict[str, dict[str, Any]]:
    """End-of-sequence ids chosen from what stock generate() produced: one row stops in the middle of the batch;
    every row stops within a few tokens (the loops run past the stop, then undo it)."""
    generated = reference[:, -NEW_TOKENS:]
    return {
        "length reached": {},
        "one row stops mid-batch": {"eos_token_id": int(generated[-1, NEW_TOKENS // 2])},
        "every row stops early": {"eos_token_id": sorted({int(token) for token in generated[:, 3]})},
    }


@pytest.mark.parametrize(
    ("dtype", "cache", "compiled"),
    [
        ("float32", "dynamic", False),
        ("bfloat16", "dynamic", False),
        ("float32", "static", False),
        ("bfloat16", "static", False),
        ("float32", "static", True),  # one shape compiled: each compiles anew (seconds on a CPU)
    ],
)
def test_greedy_search_gives_generates_tokens(demo, dtype, cache, compiled):
    model, tokenizer = load(demo, dtype), demo[1]
    for rows in (8,) if compiled else (1, 8):
        reference = generate(model, tokenizer, "generate", rows, cache, compiled)
        for case, extra in end_of_sequence_cases(reference).items():
            expected = generate(model, tokenizer, "generate", rows, cache, compiled, **extra)
            for loop in LOOPS:
                output = generate(model, tokenizer, loop, rows, cache, compiled, **extra)
                assert_same(output, expected, f"{loop}, {rows} rows, {case}")


def test_sampling_processors_and_scores_match_generate(demo):
    model, tokenizer = load(demo, "float32"), demo[1]
    stop = sorted({int(t) for t in generate(model, tokenizer, "generate", 4, "static", False)[:, -NEW_TOKENS + 6]})
    cases = {
        "sampling": {"do_sample": True, "top_k": 20, "temperature": 0.8},
        "a logits processor": {"repetition_penalty": 1.3},
        "scores and logits": {"return_dict_in_generate": True, "output_scores": True, "output_logits": True},
        "scores, stopped early": {"return_dict_in_generate": True, "output_scores": True, "eos_token_id": stop},
    }
    for case, extra in cases.items():
        expected = generate(model, tokenizer, "generate", 4, "static", False, **extra)
        for loop in LOOPS:
            assert_same(generate(model, tokenizer, loop, 4, "static", False, **extra), expected, f"{loop}, {case}")


def test_a_compiled_fused_step_is_compiled_once_and_its_static_cache_kept_across_calls(demo):
    """At the shape the compiled case above compiles (8 rows), so that inductor finds its code; the kept cache is
    given up for another shape, compiled or not (the step's compile is not what decides it)."""
    model, tokenizer = load(demo, "float32"), demo[1]
    first = generate(model, tokenizer, "fused-step", 8, "static", True)
    cache, steps = getattr(model, KEPT_CACHE), dict(getattr(model, KEPT_STEPS))
    assert torch.equal(generate(model, tokenizer, "fused-step", 8, "static", True), first)
    assert getattr(model, KEPT_CACHE) is cache, "the second call of the same shape built another cache"
    assert getattr(model, KEPT_STEPS) == steps and len(steps) == 1, "the step was compiled again"
    generate(model, tokenizer, "fused-step", 3, "static", False)
    assert getattr(model, KEPT_CACHE) is not cache, "three rows cannot use a cache of eight"


def test_the_loops_refuse_what_they_do_not_do_in_one_line(demo):
    model, tokenizer = load(demo, "float32"), demo[1]
    for loop in LOOPS:
        with pytest.raises(ValueError, match=f"decode loop {loop} does not do beam search"):
            generate(model, tokenizer, loop, 2, "dynamic", False, num_beams=2)
        with pytest.raises(ValueError, match=f"decode loop {loop} does not do assisted decoding"):
            generate(model, tokenizer, loop, 1, "dynamic", False, prompt_lookup_num_tokens=3)


def reads(model: Any, tokenizer: Any, loop: str, new_tokens: int) -> int:
    """Host reads of a device value (aten::_local_scalar_dense, which aten::item and aten::is_nonzero call) in one
    call, counted by the profiler: on a CPU each is counted where a GPU's host would wait."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        generate(model, tokenizer, loop, 2, "static", False, max_new_tokens=new_tokens)
    return sum(1 for event in profiler.events() if event.name == "aten::_local_scalar_dense")


def test_the_loops_read_the_device_every_few_tokens_where_generate_reads_it_after_each(demo):
    model, tokenizer = load(demo, "float32"), demo[1]
    per_token = {loop: (reads(model, tokenizer, loop, 48) - reads(model, tokenizer, loop, 16)) / 32 for loop in LOOPS}
    stock = (reads(model, tokenizer, "generate", 48) - reads(model, tokenizer, "generate", 16)) / 32
    assert stock >= 1, f"generate() reads the device {stock} times per token: its stop check reads it at each"
    for loop, count in per_token.items():  # at most one read every 4 tokens: one per token fails
        assert count <= 1 / 4, f"{loop} reads the device {count} times per token"
