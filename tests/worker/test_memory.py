"""Peak memory of the measured part (autotune.worker.measurement.memory): real allocations in this process on CPU.

What the CUDA path reads from torch and NVML is in test_cuda_path.py; here, what is left of it: a
missing NVML leaves its figure out of the trial's details instead of writing a zero.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from autotune.worker.measurement import memory

BLOCK_BYTES = 128 * 2**20


def allocate_and_free() -> None:
    block = torch.ones(BLOCK_BYTES // 4, dtype=torch.float32)  # written, so every page is resident
    assert block.sum().item() == BLOCK_BYTES // 4
    del block


def test_the_cpu_peak_grows_by_an_allocation_made_during_the_measured_part():
    peak = memory.PeakMemory("cpu")
    peak.reset()
    allocate_and_free()
    assert peak.peak_bytes() >= 0.95 * BLOCK_BYTES  # freed again, yet the high-water mark keeps it
    assert peak.details()["process_peak_rss_bytes"] >= BLOCK_BYTES


def test_an_allocation_freed_before_the_measured_part_is_not_counted():
    peak = memory.PeakMemory("cpu")
    if not peak.resettable:
        pytest.skip("this kernel does not let a process reset its resident-set peak (/proc/self/clear_refs)")
    allocate_and_free()
    peak.reset()
    assert peak.peak_bytes() < BLOCK_BYTES / 4


def test_without_nvml_the_cuda_details_leave_the_nvml_figure_out_instead_of_a_zero(monkeypatch):
    # No GPU here: torch's allocator readings are stubbed; NVML is really missing (its import fails).
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 123)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 456)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    peak = memory.PeakMemory("cuda:0")
    peak.reset()
    assert peak.peak_bytes() == 123
    assert peak.details() == {"peak_reserved_bytes": 456.0}


FIRST_LOAD = """
import sys, torch
from transformers import AutoModelForCausalLM
from autotune.worker.loading import import_first_call_modules
if sys.argv[2] == "first": import_first_call_modules()
before = set(sys.modules)
AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
print(" ".join(sorted({name.split(".")[0] for name in set(sys.modules) - before})))
"""


@pytest.mark.parametrize("library", ["torchao", "scipy"])
def test_libraries_the_first_load_imports_are_imported_before_the_memory_baseline(library, tmp_path):
    # transformers imports every quantizer (torchao with them) and every loss (scipy) on its first
    # from_pretrained(): tens of MB of modules that must not count as the model's memory on CPU.
    pytest.importorskip(library)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path)

    def imported_by_load(mode: str) -> set[str]:
        run = subprocess.run([sys.executable, "-c", FIRST_LOAD, str(tmp_path), mode], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return set(run.stdout.split())

    assert library in imported_by_load("bare")  # what the trial would otherwise count as model memory
    assert library not in imported_by_load("first")
