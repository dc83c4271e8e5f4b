"""What a trial ran on: device, driver and library versions."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
from pathlib import Path
from typing import Any

import torch

from autotune.space.knobs import Requires
from autotune.worker.fpmath import bf16_changes_fp32_matmuls

_PACKAGES = (
    "torch",
    "transformers",
    "accelerate",
    "bitsandbytes",
    "kernels",
    "tokenizers",
    "torchao",
    "optimum-quanto",
    "hqq",
)


def environment(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "device": device}
    for package in _PACKAGES:
        try:
            info[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            info[package] = None
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        properties = torch.cuda.get_device_properties(index)
        info["device_name"] = properties.name
        info["compute_capability"] = f"{properties.major}.{properties.minor}"
        info["device_memory_bytes"] = properties.total_memory
        info["cuda"] = torch.version.cuda
        info["driver"] = _nvidia_driver()
    else:
        info["device_name"] = cpu_name()
        info["cpu_threads"] = torch.get_num_threads()
        info["bf16_changes_fp32_matmuls"] = bf16_changes_fp32_matmuls()  # the probe the cpu profile prunes with
    return info


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML missing or failing only costs the driver field
        return None
    return version.decode() if isinstance(version, bytes) else version


def installed_version(requirement: Requires) -> str | None:
    """The version of a package that can be imported here, or None."""
    try:
        if importlib.util.find_spec(requirement.import_name) is None:
            return None
        return importlib.metadata.version(requirement.package)
    except (ModuleNotFoundError, importlib.metadata.PackageNotFoundError):  # its parent package is missing
        return None
