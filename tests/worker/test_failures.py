"""Failure classification (autotune.worker.failures), one row per kind of failure, through classify() only."""

from __future__ import annotations

import subprocess

import pytest
import torch

from autotune.process.results import Outcome
from autotune.worker.failures import BrokenOutputError, UnsupportedError, classify

BF16 = {"dtype": "bfloat16", "attn_implementation": "sdpa", "quantization": "none"}
FOUR_BIT = {**BF16, "quantization": "bnb-4bit"}
COMPILED = {**BF16, "cache_implementation": "static", "compile": "max-autotune"}
OFFLOADED = {**BF16, "cache_implementation": "offloaded_static"}

# (error, config) -> (outcome, blamed knob, blamed for certain, words the reason must contain)
CASES = [
    pytest.param(
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        BF16,
        (Outcome.OOM, None, False, ("OutOfMemoryError", "Tried to allocate 2.00 GiB")),
        id="torch-cuda-oom",
    ),
    pytest.param(MemoryError(), BF16, (Outcome.OOM, None, False, ("MemoryError",)), id="python-memory-error"),
    pytest.param(
        RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: 8 GB"),
        BF16,
        (Outcome.OOM, None, False, ("RuntimeError", "DefaultCPUAllocator")),
        id="cpu-allocator-message",
    ),
    pytest.param(
        RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"),
        BF16,
        (Outcome.OOM, None, False, ("CUBLAS_STATUS_ALLOC_FAILED",)),
        id="cublas-alloc",
    ),
    pytest.param(
        BrokenOutputError("the model produced NaN or infinite logits on the evaluation text"),
        FOUR_BIT,
        (Outcome.BROKEN, None, False, ("NaN or infinite logits",)),
        id="broken-output",
    ),
    pytest.param(
        ModuleNotFoundError("No module named 'bitsandbytes'"),
        FOUR_BIT,
        (Outcome.UNSUPPORTED, "quantization", True, ("bitsandbytes",)),
        id="missing-package-blames-its-knob",
    ),
    pytest.param(
        NotImplementedError("inductor has no lowering for this op"),
        COMPILED,
        (Outcome.UNSUPPORTED, "compile", True, ("NotImplementedError", "inductor")),
        id="compiler-refusal-blames-compile",
    ),
    pytest.param(
        ValueError("offloaded_static is not supported on a CPU device"),
        OFFLOADED,
        (Outcome.UNSUPPORTED, "cache_implementation", False, ("offloaded_static",)),
        id="named-value-of-an-untyped-error-is-only-suspected",
    ),
    pytest.param(
        UnsupportedError("no hub kernel could be fetched for any layer", knob="use_kernels"),
        {**BF16, "use_kernels": "on"},
        (Outcome.UNSUPPORTED, "use_kernels", True, ("no hub kernel",)),
        id="the-workers-own-check-names-its-knob",
    ),
    pytest.param(
        RuntimeError("flex attention requires a GPU"),
        {"dtype": "float32"},
        (Outcome.UNSUPPORTED, None, False, ("requires a GPU",)),
        id="unsupported-but-the-knob-is-not-set",
    ),
    pytest.param(
        RuntimeError("No available kernel. Aborting execution."),
        {"dtype": "float32", "attn_implementation": "sdpa", "sdpa_backend": "flash"},
        (Outcome.UNSUPPORTED, None, False, ("No available kernel",)),
        id="forced-sdpa-kernel-that-cannot-run-these-inputs-blames-no-single-value",
    ),
    pytest.param(
        ImportError("No module named 'flash_attn'"),
        None,
        (Outcome.UNSUPPORTED, None, False, ("flash_attn",)),
        id="no-config-no-blame",
    ),
    pytest.param(
        UnsupportedError("offloaded_static with max-autotune cannot be used together", combination=True),
        {**OFFLOADED, "compile": "max-autotune"},
        (Outcome.UNSUPPORTED, None, False, ("cannot be used together",)),
        id="combination-blames-no-single-value",
    ),
    pytest.param(
        RuntimeError("shape '[4, 64]' is invalid for input of size 250"),
        COMPILED,
        (Outcome.ERROR, None, False, ("RuntimeError", "is invalid for input")),
        id="plain-error",
    ),
    pytest.param(
        subprocess.TimeoutExpired(["nvcc", "--version"], 5),
        COMPILED,
        (Outcome.ERROR, None, False, ("TimeoutExpired", "timed out after 5 seconds")),
        id="helper-subprocess-timeout",
    ),
    pytest.param(
        KeyError("model.layers.0.self_attn.q_proj.weight"),
        BF16,
        (Outcome.ERROR, None, False, ("KeyError", "q_proj")),
        id="key-error",
    ),
]


@pytest.mark.parametrize(("error", "config", "expected"), CASES)
def test_a_failure_gets_its_outcome_its_blamed_knob_and_a_reason_that_says_what_happened(error, config, expected):
    outcome, knob, certain, words = expected
    classified = classify(error, config)
    assert (classified.outcome, classified.knob, classified.certain) == (outcome, knob, certain)
    for word in words:
        assert word in classified.message


def test_out_of_memory_wins_over_words_of_an_unsupported_value():
    refusal_while_allocating = ImportError("flash_attn kernels: CUDA error: out of memory")
    assert classify(refusal_while_allocating, {**BF16, "attn_implementation": "flash_attention_2"}).outcome == (
        Outcome.OOM
    )


def test_a_message_that_happens_to_contain_a_knobs_word_only_suspects_the_value():
    """ "cache" in a RuntimeError about something else: the static cache is suspected, never excluded at once."""
    error = RuntimeError("the tokenizer's cache is not supported for this vocabulary")
    classified = classify(error, {**BF16, "cache_implementation": "static"})
    assert (classified.outcome, classified.knob, classified.certain) == (
        Outcome.UNSUPPORTED,
        "cache_implementation",
        False,
    )
