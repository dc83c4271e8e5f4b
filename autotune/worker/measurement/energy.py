"""Energy a GPU used during the measured part of a trial, from NVML's cumulative energy counter.

Absent (None), never zero, where there is no counter: on CPU, without NVML, or on a GPU older than Volta.
"""

from __future__ import annotations

from typing import Any

from autotune.figures.metrics import ENERGY_PER_TOKEN


class EnergyCounter:
    """Millijoules since the device's driver loaded, read at start() and at joules()."""

    def __init__(self, device: str) -> None:
        self.handle: Any = None
        self.start_mj: int | None = None
        if device.startswith("cuda"):
            self.handle = _nvml_handle(int(device.partition(":")[2] or 0))

    def start(self) -> None:
        self.start_mj = self._read_mj()

    def joules(self) -> float | None:
        """Joules since start(), or None where the device has no energy counter."""
        end = self._read_mj()
        if end is None or self.start_mj is None:
            return None
        return (end - self.start_mj) / 1000

    def _read_mj(self) -> int | None:
        if self.handle is None:
            return None
        import pynvml

        try:
            return int(pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except pynvml.NVMLError:
            return None


def _nvml_handle(index: int) -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # no NVML library, no driver: no energy figure
        return None


def energy_figures(joules: float | None, tokens: float) -> dict[str, float]:
    """Joules and joules per generated token; nothing at all when there is no counter."""
    if joules is None or tokens <= 0:
        return {}
    return {"energy_j": joules, ENERGY_PER_TOKEN.name: joules / tokens}
