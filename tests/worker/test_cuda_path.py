"""The decisions of the CUDA path, checked on CPU: what the worker passes to transformers and torch on a GPU,
how it reads failures, and how it adapts a plan to the installed transformers."""

from __future__ import annotations

import importlib
import itertools
import time
from dataclasses import dataclass

import pytest
import torch

from autotune.process.results import Outcome
from autotune.space import Target, build_plan, rules
from autotune.worker import compat
from autotune.worker.failures import UnsupportedError, classify
from autotune.worker.measurement import memory
from autotune.worker.measurement.token_clock import TokenClock, synchronize

FLASH = {"dtype": "bfloat16", "attn_implementation": "flash_attention_2", "quantization": "none"}
HUB_KERNEL = {**FLASH, "attn_implementation": "kernels-community/flash-attn2"}
QUANTIZED_CACHE = {"dtype": "bfloat16", "batching": "generate", "cache_implementation": "quantized"}


# ------------------------------------------------------------------------ unsupported values are excluded


@pytest.mark.parametrize(
    ("error", "config", "knob"),
    [
        (
            ImportError("FlashAttention2 has been toggled on, but the package flash_attn seems not installed"),
            FLASH,
            "attn_implementation",
        ),
        (ValueError("LlamaForCausalLM does not support Flash Attention 2 yet"), FLASH, "attn_implementation"),
        (
            OSError("We couldn't connect to 'https://huggingface.co' to load kernels-community/flash-attn2 (offline)"),
            HUB_KERNEL,
            "attn_implementation",
        ),
        (
            UnsupportedError("a quantized KV cache needs a backend: transformers 5.17.0 has no fp8 backend"),
            QUANTIZED_CACHE,
            "cache_implementation",
        ),
        (
            NotImplementedError("bitsandbytes 4-bit is not supported with compile"),
            {"quantization": "bnb-4bit"},
            "quantization",
        ),
    ],
)
def test_an_unsupported_value_is_blamed_on_its_knob(error, config, knob):
    """Only an ImportError used to exclude a value; a refusal of any kind came back trial after trial."""
    classified = classify(error, config)
    assert classified.outcome == Outcome.UNSUPPORTED
    assert classified.knob == knob


def test_a_message_naming_only_a_default_blames_no_knob():
    classified = classify(ValueError("sdpa is not supported for this input"), {"attn_implementation": "sdpa"})
    assert classified.outcome == Outcome.UNSUPPORTED
    assert classified.knob is None


def test_an_architecture_that_refuses_sdpa_at_load_excludes_sdpa():
    """Gemma2, GPT-J, Bloom refuse sdpa when loaded: that refusal names the default yet blames the knob."""
    refusal = ValueError(
        "Gemma2ForCausalLM does not support an attention implementation through "
        "torch.nn.functional.scaled_dot_product_attention yet. Please request the support for this architecture"
    )
    classified = classify(refusal, {"dtype": "float32", "attn_implementation": "sdpa"})
    assert classified.outcome == Outcome.UNSUPPORTED
    assert classified.knob == "attn_implementation"


def test_a_plain_error_is_an_error_and_out_of_memory_is_oom():
    assert classify(RuntimeError("shape mismatch"), FLASH).outcome == Outcome.ERROR
    assert classify(RuntimeError("CUDA error: out of memory"), FLASH).outcome == Outcome.OOM


# ------------------------------------------------------------------------------- version facts


def _installed(version: str, quanto: bool = False, hqq: bool = False):
    """What rules.installation_problem asks of the environment: a transformers version and which packages import."""
    versions = {"transformers": version, "optimum-quanto": "0.2.7" if quanto else None, "hqq": "0.2.8" if hqq else None}
    return lambda requirement: versions.get(requirement.package, "1.0")


def _refused(config: dict, version: str, **packages: bool):
    return rules.installation_problem(config, _installed(version, **packages))


def test_fp8_kv_cache_runs_where_transformers_has_it():
    assert _refused({**QUANTIZED_CACHE, "kv_cache_backend": "fp8"}, "5.22.2") is None


def test_a_kv_cache_backend_this_transformers_lacks_is_refused_and_blamed_on_the_backend():
    """The backend is a knob: another one is never measured in its place."""
    config = {**QUANTIZED_CACHE, "kv_cache_backend": "fp8"}
    refused = _refused(config, "5.17.0", quanto=True, hqq=True)
    assert refused is not None and (refused.knob, refused.value) == ("kv_cache_backend", "fp8")
    assert refused.message.endswith(
        "transformers 5.17.0 has no fp8 KV-cache backend (it has from 5.22): upgrade transformers"
    )
    assert _refused({**QUANTIZED_CACHE, "kv_cache_backend": "hqq"}, "5.17.0", quanto=True, hqq=True) is None


@pytest.mark.parametrize(("backend", "package"), [("quanto", "optimum-quanto"), ("hqq", "hqq")])
def test_a_kv_cache_backend_without_its_package_is_refused_with_what_to_install(backend, package):
    refused = _refused({**QUANTIZED_CACHE, "kv_cache_backend": backend}, "5.22.2")
    assert refused is not None and refused.knob == "kv_cache_backend"
    assert refused.message.endswith(f'needs {package}, which is not installed: pip install "autotune[quant]"')


FLEX_STATIC = {"dtype": "bfloat16", "attn_implementation": "flex_attention", "cache_implementation": "static"}


def test_flex_attention_with_a_static_cache_is_refused_where_generate_breaks_it_blaming_neither_value():
    assert _refused(FLEX_STATIC, "5.17.0") is None
    refused = _refused(FLEX_STATIC, "5.22.2")
    assert refused is not None and "use a dynamic cache with flex_attention" in refused.message
    assert refused.knob is None
    classified = classify(UnsupportedError(refused.message, combination=True), FLEX_STATIC)
    assert classified.outcome == Outcome.UNSUPPORTED and classified.knob is None


@dataclass
class ContinuousBatchingConfig517:
    """The fields transformers 5.17 has where later versions renamed or added some."""

    block_size: int = 256
    num_blocks: int | None = None
    max_batch_tokens: int | None = None
    max_requests_per_batch: int | None = None


def test_continuous_batching_options_take_the_names_of_the_installed_version(monkeypatch):
    plan = build_plan({"batching": "continuous", "max_batch_tokens": 256}, Target("cuda", 8, 192))
    built = compat.continuous_batching_config(plan.continuous)
    assert (built.page_size, built.num_blocks, built.max_batch_tokens) == (32, 50, 256)
    assert built.auto_switch_to_flash is False
    # the module that is imported now: loading some models replaces sys.modules["transformers"]
    installed = importlib.import_module("transformers")
    monkeypatch.setattr(installed, "ContinuousBatchingConfig", ContinuousBatchingConfig517)
    old = compat.continuous_batching_config(plan.continuous)
    assert old == ContinuousBatchingConfig517(
        block_size=32, num_blocks=50, max_batch_tokens=256, max_requests_per_batch=8
    )
    with pytest.raises(UnsupportedError, match="upgrade"):
        compat.continuous_batching_config({**plan.continuous, "scheduler_type": "fifo"})


# ----------------------------------------------------------------------- what the timers and memory do on CUDA


class StampedEvent:
    """A CUDA event needs a GPU: this one takes the host's time when it is recorded, and measures as torch's does."""

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at: float | None = None

    def record(self, stream: object = None) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: StampedEvent) -> float:
        assert self.at is not None and end.at is not None, "an event read before it was recorded"
        return (end.at - self.at) * 1e3  # milliseconds


def test_on_cuda_the_clock_records_an_event_per_token_and_waits_only_at_start_and_stop(monkeypatch):
    waits = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waits.append(device))
    monkeypatch.setattr(torch.cuda, "Event", StampedEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    device = torch.device("cuda", 1)
    clock = TokenClock(device)
    started = clock.start()
    rows = torch.zeros(2, 3, dtype=torch.long)
    for _ in range(3):
        time.sleep(0.01)
        assert not clock(rows, None).any()  # never stops generation
    assert waits == [device]  # the tokens made the host wait for nothing
    end = clock.stop()
    assert waits == [device, device]
    times = clock.times(started)
    assert len(times) == 3 and started < times[0] and times[-1] <= end
    assert all(later - earlier >= 0.01 for earlier, later in itertools.pairwise(times))
    synchronize(torch.device("cpu"))
    assert len(waits) == 2  # nothing to wait for on a CPU


def test_cuda_peak_memory_is_torch_allocator_peak_since_reset_with_an_nvml_peak_sampled_meanwhile(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 123)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 456)
    readings = iter([100, 300, 200])

    class FakeNvmlPeak(memory.NvmlPeak):
        def _sample(self) -> None:  # what the sampling thread would read from NVML, in turn
            for reading in readings:
                self.peak = max(self.peak or 0, reading)

    monkeypatch.setattr(memory, "NvmlPeak", FakeNvmlPeak)
    peak = memory.PeakMemory("cuda:0")
    peak.reset()
    assert calls == ["sync", "reset"]
    assert peak.peak_bytes() == 123
    assert peak.details() == {"peak_reserved_bytes": 456.0, "nvml_process_peak_bytes": 300.0}


def test_nvml_peak_reports_nothing_where_nvml_is_missing(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    sampler = memory.NvmlPeak(0, interval_s=0.001)
    sampler.start()
    sampler.stop()
    assert sampler.peak is None


def test_cuda_graph_compile_modes_and_offloaded_caches_need_cuda_and_compile_needs_no_switch_there():

    assert rules.needs_of("compile", "reduce-overhead").cuda
    assert rules.needs_of("compile", "max-autotune").cuda
    assert not rules.needs_of("compile", "default").cuda
    assert rules.needs_of("cache_implementation", "offloaded").cuda
    assert rules.needs_of("cache_implementation", "offloaded_static").cuda
    config = {"cache_implementation": "static", "compile": "reduce-overhead"}
    assert build_plan(config, Target("cuda")).generate["compile_config"].attrs == {}
    assert build_plan(config, Target("cpu")).generate["compile_config"].attrs == {"_compile_all_devices": True}


# ------------------------------------------------------------------------ worker set-up on a CUDA device


class FakeCuda:
    """torch.cuda as `_configure` uses it, recording what it is asked to do."""

    def __init__(self, available: bool, total_bytes: int = 80 * 2**30) -> None:
        self.available, self.total_bytes, self.calls = available, total_bytes, []

    def is_available(self) -> bool:
        return self.available

    def set_device(self, device) -> None:
        self.calls.append(("set_device", str(device)))

    def get_device_properties(self, device):
        return type("Properties", (), {"total_memory": self.total_bytes})

    def set_per_process_memory_fraction(self, fraction: float, device) -> None:
        self.calls.append(("fraction", round(fraction, 4), str(device)))

    def install(self, monkeypatch) -> None:
        for name in ("is_available", "set_device", "get_device_properties", "set_per_process_memory_fraction"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))


def _spec(device: str, cap: int | None):
    from autotune.process.results import TaskSpec
    from autotune.specs import ModelSpec

    return TaskSpec("trial", ModelSpec("demo"), device, "/tmp", memory_cap_bytes=cap)


@pytest.mark.parametrize(
    ("cap", "expected"),
    [
        (16 * 2**30, [("set_device", "cuda:1"), ("fraction", 0.2, "cuda:1")]),  # a T4's 16 GB profile on an 80 GB GPU
        (80 * 2**30, [("set_device", "cuda:1")]),  # the profile is the GPU: no cap
        (None, [("set_device", "cuda:1")]),
    ],
)
def test_the_worker_caps_gpu_memory_to_the_profile_only_when_the_profile_is_smaller(monkeypatch, cap, expected):
    from autotune.worker import tasks

    fake = FakeCuda(available=True)
    fake.install(monkeypatch)
    tasks._configure(_spec("cuda:1", cap))
    assert fake.calls == expected


def test_a_cuda_device_where_torch_sees_none_is_a_clear_error(monkeypatch):
    from autotune.worker import tasks

    FakeCuda(available=False).install(monkeypatch)
    with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
        tasks._configure(_spec("cuda:0", None))
