"""Hardware profiles: what a GPU can run, how much memory and bandwidth it has, what an hour costs.

Detection reads NVML (nvidia-ml-py), never torch, so the study process stays light.
Prices are indicative on-demand cloud prices per GPU-hour (late 2025); override them with --price.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import asdict, dataclass

from autotune.errors import UserError
from autotune.space import rules
from autotune.space.knobs import Value

log = logging.getLogger(__name__)

GIB = 1024**3


@dataclass(frozen=True)
class GpuProfile:
    name: str
    description: str
    kind: str  # "cuda" or "cpu"
    memory_bytes: int | None  # None: the host's memory
    compute_capability: float | None
    bandwidth_gb_s: float  # peak memory bandwidth, 1e9 bytes/s
    price_per_hour: float | None

    @property
    def device_type(self) -> str:
        return self.kind

    def why_not_value(self, knob: str, value: Value) -> str | None:
        """Why this profile cannot run a knob value, or None (autotune/space/rules.py decides)."""
        return rules.hardware_problem(knob, value, self, visible_gpu_count)

    def to_json(self) -> dict:
        return asdict(self)


PROFILES: dict[str, GpuProfile] = {
    profile.name: profile
    for profile in (
        GpuProfile("t4", "NVIDIA T4 16 GB (Turing)", "cuda", 16 * GIB, 7.5, 320, 0.53),
        GpuProfile("a10g", "NVIDIA A10G 24 GB (Ampere)", "cuda", 24 * GIB, 8.6, 600, 1.01),
        GpuProfile("l4", "NVIDIA L4 24 GB (Ada)", "cuda", 24 * GIB, 8.9, 300, 0.80),
        GpuProfile("a100-40gb", "NVIDIA A100 40 GB SXM (Ampere)", "cuda", 40 * GIB, 8.0, 1555, 1.29),
        GpuProfile("a100-80gb", "NVIDIA A100 80 GB SXM (Ampere)", "cuda", 80 * GIB, 8.0, 2039, 1.79),
        GpuProfile("h100", "NVIDIA H100 80 GB SXM (Hopper)", "cuda", 80 * GIB, 9.0, 3350, 2.99),
        GpuProfile("h200", "NVIDIA H200 141 GB SXM (Hopper)", "cuda", 141 * 10**9, 9.0, 4800, 3.79),
        GpuProfile("cpu", "CPU only (nominal DDR bandwidth)", "cpu", None, None, 40, 0.10),
    )
}

# NVML device-name fragments, most specific first.
_NAME_HINTS = (
    ("H200", "h200"),
    ("H100", "h100"),
    ("A100-SXM4-80GB", "a100-80gb"),
    ("A100 80GB", "a100-80gb"),
    ("A100-PCIE-80GB", "a100-80gb"),
    ("A100", "a100-40gb"),
    ("A10G", "a10g"),
    ("L4", "l4"),
    ("T4", "t4"),
)


@dataclass(frozen=True)
class DetectedDevice:
    name: str
    memory_bytes: int
    compute_capability: float
    bandwidth_gb_s: float | None
    driver: str

    def matching_profile(self) -> str | None:
        for hint, profile in _NAME_HINTS:
            if hint in self.name:
                return profile
        return None


def detect_gpu(index: int = 0) -> DetectedDevice | None:
    """The GPU at this index as NVML sees it, or None when there is no usable NVIDIA GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        if index >= pynvml.nvmlDeviceGetCount():
            return None
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        bandwidth = _nvml_bandwidth(pynvml, handle)
        return DetectedDevice(name, int(memory), float(f"{major}.{minor}"), bandwidth, driver)
    except pynvml.NVMLError as error:
        log.debug("NVML query failed: %s", error)
        return None
    finally:
        pynvml.nvmlShutdown()


@functools.cache
def visible_gpu_count() -> int:
    """The NVIDIA GPUs this process may use: NVML's count, narrowed by CUDA_VISIBLE_DEVICES when it is set."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        import pynvml

        pynvml.nvmlInit()
    except (ImportError, OSError) as error:
        log.debug("no NVML: %s", error)
        return 0
    except pynvml.NVMLError:
        return 0
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    if visible is None:
        return count
    return min(count, len([item for item in visible.split(",") if item.strip()]))


def _nvml_bandwidth(pynvml, handle) -> float | None:
    try:
        bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
        clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
    except pynvml.NVMLError:
        return None
    return bus_bits / 8 * clock_mhz * 1e6 * 2 / 1e9  # double data rate


def has_energy_counter(device: str) -> bool:
    """Whether `device` reports the energy it used (NVML's counter: a GPU of Volta or later); never a CPU."""
    if not device.startswith("cuda"):
        return False
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVML library, no driver: no energy figure
        return False
    try:
        pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.nvmlDeviceGetHandleByIndex(device_index(device)))
        return True
    except pynvml.NVMLError:
        return False
    finally:
        pynvml.nvmlShutdown()


def device_index(device: str) -> int:
    return int(device.split(":", 1)[1]) if ":" in device else 0


@dataclass(frozen=True)
class ResolvedHardware:
    """The profile the search prunes for, the device trials run on, and a note when they differ."""

    profile: GpuProfile
    device: str
    detected: DetectedDevice | None
    note: str | None


def resolve_hardware(gpu: str, device: str | None) -> ResolvedHardware:
    """Pick the profile (`--gpu`, or detect with 'auto') and check it against `--device`."""
    detected = _detect(device)
    if gpu == "auto":
        return hardware_for(_auto_profile(detected), device, detected)
    if gpu in PROFILES:
        return hardware_for(PROFILES[gpu], device, detected)
    raise UserError(f"unknown --gpu {gpu!r}; choose one of: auto, {', '.join(PROFILES)} (see `autotune gpus`)")


def hardware_for(profile: GpuProfile, device: str | None, detected: DetectedDevice | None = None) -> ResolvedHardware:
    """Run trials for `profile` on `device` (a worker joining a study gets the study's profile)."""
    detected = detected if detected is not None else _detect(device)
    if profile.kind == "cuda" and detected is None:
        raise UserError(
            f"profile {profile.name} needs a CUDA GPU, but none was found here; "
            "use --gpu cpu or run on a machine with a GPU"
        )
    if device is None:
        device = "cpu" if profile.kind == "cpu" else "cuda:0"
    return ResolvedHardware(profile, device, detected, _mismatch_note(profile, detected))


def _detect(device: str | None) -> DetectedDevice | None:
    if device is not None and not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
        raise UserError(f"--device {device!r} is not a device: use cpu, cuda or cuda:N")
    if device == "cpu" or os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return None
    return detect_gpu(device_index(device or "cuda"))


def _auto_profile(detected: DetectedDevice | None) -> GpuProfile:
    if detected is None:
        return PROFILES["cpu"]
    name = detected.matching_profile()
    if name:
        return PROFILES[name]
    return GpuProfile(
        name="detected",
        description=detected.name,
        kind="cuda",
        memory_bytes=detected.memory_bytes,
        compute_capability=detected.compute_capability,
        bandwidth_gb_s=detected.bandwidth_gb_s or 0.0,
        price_per_hour=None,
    )


def _mismatch_note(profile: GpuProfile, detected: DetectedDevice | None) -> str | None:
    if profile.kind != "cuda" or detected is None:
        return None
    if detected.matching_profile() == profile.name or profile.name == "detected":
        return None
    return (
        f"--gpu {profile.name} ({profile.description}) differs from this machine's {detected.name}: "
        f"knobs are pruned for {profile.name} and GPU memory is capped at its size, "
        "but speed is measured on this GPU"
    )
