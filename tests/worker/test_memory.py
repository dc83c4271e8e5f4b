"""Peak memory of the measured part (autotune.worker.measurement.memory): real allocations in this process on CPU.

What the CUDA path reads from torch and NVML is in test_cuda_path.py; here, what is left of it: a
missing NVML leaves its figure out of the trial's details instead of writing a zero.
"""

from __future__ import annotations

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
