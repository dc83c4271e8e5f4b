"""Peak memory of the measured part of a trial: torch's allocator on CUDA, resident set size on CPU."""

from __future__ import annotations

import os
import re
import resource
import threading
from pathlib import Path
from typing import Any

import torch

_STATUS = Path("/proc/self/status")


class PeakMemory:
    """Peak bytes used by the model and the workload, not by the interpreter and its libraries.

    CUDA: torch.cuda.max_memory_allocated since reset(). CPU: the resident set's high-water mark
    (VmHWM, reset through /proc/self/clear_refs) less its file-backed pages (shared libraries and
    mapped files, which grow as code is first run), less the anonymous memory before the model was
    loaded: the growth of the process's own memory since then, at its peak.
    """

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.device = torch.device(device)
        self.baseline = 0 if self.cuda else _status_bytes("RssAnon")
        self.resettable = self.cuda or _can_reset_rss_peak()
        self.nvml: NvmlPeak | None = None

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.nvml = NvmlPeak(self.device.index or 0)
            self.nvml.start()
        elif self.resettable:
            Path("/proc/self/clear_refs").write_text("5")

    def peak_bytes(self) -> int:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            if self.nvml is not None:
                self.nvml.stop()
            return torch.cuda.max_memory_allocated(self.device)
        file_backed = _status_bytes("RssFile") + _status_bytes("RssShmem")
        return max(0, _rss_peak_bytes() - file_backed - self.baseline)

    def details(self) -> dict[str, float]:
        if self.cuda:
            details = {"peak_reserved_bytes": float(torch.cuda.max_memory_reserved(self.device))}
            if self.nvml is not None and self.nvml.peak is not None:
                details["nvml_process_peak_bytes"] = float(self.nvml.peak)
            return details
        return {"process_baseline_bytes": float(self.baseline), "process_peak_rss_bytes": float(_rss_peak_bytes())}


def _status_kb(field: str) -> int | None:
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _status_bytes(field: str) -> int:
    kb = _status_kb(field)
    return kb * 1024 if kb is not None else 0


def _rss_peak_bytes() -> int:
    kb = _status_kb("VmHWM")
    if kb is None:  # not Linux: the whole process's peak, which cannot be reset
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb * 1024


def _can_reset_rss_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class NvmlPeak:
    """The most GPU memory NVML attributes to this process (CUDA context and allocator cache included),
    sampled every `interval_s` on a thread between start() and stop(); None where NVML cannot tell."""

    def __init__(self, index: int, interval_s: float = 0.02) -> None:
        self.index = index
        self.interval_s = interval_s
        self.peak: int | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="autotune-nvml-peak", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # no NVML: this figure is simply not reported
            return
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            while True:
                reading = _process_bytes(pynvml, handle)
                if reading is not None:
                    self.peak = max(self.peak or 0, reading)
                if self._done.wait(self.interval_s):
                    return
        except pynvml.NVMLError:
            return
        finally:
            pynvml.nvmlShutdown()


def _process_bytes(pynvml: Any, handle: Any) -> int | None:
    for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if process.pid == os.getpid() and process.usedGpuMemory is not None:
            return int(process.usedGpuMemory)
    return None
