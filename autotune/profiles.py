"""Hardware profiles: what a GPU can run, how much memory and bandwidth it has, what an hour costs.

Detection reads NVML (nvidia-ml-py), never torch, so the study process stays light. A card found here
is described by NVML's own answers; a named profile adds its display name and price. What only torch can say
about this machine (whether fp32_precision=bf16 changes its float32 matmuls) the trial worker's probe answers,
run as a program of its own, once per CPU and torch (fpmath_probe.py).
Prices are indicative on-demand cloud prices per GPU-hour (late 2025); override them with --price.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from autotune.errors import UserError
from autotune.fpmath_probe import bf16_changes_fp32_matmuls
from autotune.space import rules
from autotune.space.knobs import DeviceType, Value

log = logging.getLogger(__name__)

GIB = 1024**3


@dataclass(frozen=True)
class HardwareProfile:
    """What a study is searched for: a GPU, or the CPU (device_type says which)."""

    name: str
    description: str
    device_type: DeviceType
    memory_bytes: int | None  # None: the host's memory
    compute_capability: float | None
    bandwidth_gb_s: float  # peak memory bandwidth, 1e9 bytes/s
    price_per_hour: float | None

    def why_not_value(self, knob: str, value: Value) -> str | None:
        """Why this profile cannot run a knob value, or None (autotune/space/rules.py decides)."""
        return rules.hardware_problem(knob, value, self, THIS_MACHINE)

    def to_json(self) -> dict[str, Any]:
        """The stored form: device_type under its stored key, so that every stored study reads alike."""
        return {STORED_KEYS.get(name, name): value for name, value in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HardwareProfile:
        """A profile stored with a study (fields of later versions ignored)."""
        stored = {name: STORED_KEYS.get(name, name) for name in cls.__dataclass_fields__}
        return cls(**{name: data[key] for name, key in stored.items() if key in data})


# Fields stored under another name: studies have always stored the device type as "kind" (study/migrations.py
# fills it in profiles stored before it).
STORED_DEVICE_TYPE = "kind"
STORED_KEYS = {"device_type": STORED_DEVICE_TYPE}


# The named profiles. A card found here takes its memory, compute capability and bandwidth from NVML
# (profile_for); its named profile adds what NVML cannot say, a display name and a price. The figures
# below are used when --gpu names a card this machine does not have. Memory, peak bandwidth and compute
# capability are NVIDIA's datasheet figures (the source of each is beside it; compute capability:
# developer.nvidia.com/cuda-gpus). Prices: indicative on-demand cloud prices per GPU-hour, late 2025.
PROFILES: dict[str, HardwareProfile] = {
    profile.name: profile
    for profile in (
        # T4 datasheet: 16 GB GDDR6, 320 GB/s; Turing, 7.5
        HardwareProfile("t4", "NVIDIA T4 16 GB (Turing)", "cuda", 16 * GIB, 7.5, 320, 0.53),
        # AWS EC2 G5 (A10G): 24 GB GDDR6, 600 GB/s; Ampere GA102, 8.6
        HardwareProfile("a10g", "NVIDIA A10G 24 GB (Ampere)", "cuda", 24 * GIB, 8.6, 600, 1.01),
        # A10 datasheet: 24 GB GDDR6, 600 GB/s; Ampere GA102, 8.6
        HardwareProfile("a10", "NVIDIA A10 24 GB (Ampere)", "cuda", 24 * GIB, 8.6, 600, 0.75),
        # L4 datasheet: 24 GB GDDR6, 300 GB/s; Ada, 8.9
        HardwareProfile("l4", "NVIDIA L4 24 GB (Ada)", "cuda", 24 * GIB, 8.9, 300, 0.80),
        # L40 datasheet: 48 GB GDDR6 with ECC, 864 GB/s; Ada, 8.9
        HardwareProfile("l40", "NVIDIA L40 48 GB (Ada)", "cuda", 48 * GIB, 8.9, 864, 0.99),
        # L40S datasheet: 48 GB GDDR6 with ECC, 864 GB/s; Ada, 8.9
        HardwareProfile("l40s", "NVIDIA L40S 48 GB (Ada)", "cuda", 48 * GIB, 8.9, 864, 0.86),
        # RTX A6000 datasheet: 48 GB GDDR6, 768 GB/s; Ampere GA102, 8.6
        HardwareProfile("a6000", "NVIDIA RTX A6000 48 GB (Ampere)", "cuda", 48 * GIB, 8.6, 768, 0.80),
        # RTX 6000 Ada Generation datasheet: 48 GB GDDR6, 960 GB/s; Ada, 8.9
        HardwareProfile("rtx6000-ada", "NVIDIA RTX 6000 Ada 48 GB (Ada)", "cuda", 48 * GIB, 8.9, 960, 0.77),
        # GeForce RTX 4090 specifications: 24 GB GDDR6X, 384-bit at 21 Gbps = 1008 GB/s; Ada, 8.9
        HardwareProfile("rtx4090", "NVIDIA GeForce RTX 4090 24 GB (Ada)", "cuda", 24 * GIB, 8.9, 1008, 0.69),
        # A100 datasheet: 40 GB HBM2, 1555 GB/s (SXM and PCIe); 80 GB HBM2e, 2039 GB/s SXM, 1935 GB/s PCIe; 8.0
        HardwareProfile("a100-40gb", "NVIDIA A100 40 GB SXM (Ampere)", "cuda", 40 * GIB, 8.0, 1555, 1.29),
        HardwareProfile("a100-40gb-pcie", "NVIDIA A100 40 GB PCIe (Ampere)", "cuda", 40 * GIB, 8.0, 1555, 1.29),
        HardwareProfile("a100-80gb", "NVIDIA A100 80 GB SXM (Ampere)", "cuda", 80 * GIB, 8.0, 2039, 1.79),
        HardwareProfile("a100-80gb-pcie", "NVIDIA A100 80 GB PCIe (Ampere)", "cuda", 80 * GIB, 8.0, 1935, 1.64),
        # H100 datasheet: SXM 80 GB HBM3, 3.35 TB/s; PCIe 80 GB HBM2e, 2 TB/s; NVL 94 GB HBM3, 3.9 TB/s; 9.0
        HardwareProfile("h100", "NVIDIA H100 80 GB SXM (Hopper)", "cuda", 80 * GIB, 9.0, 3350, 2.99),
        HardwareProfile("h100-pcie", "NVIDIA H100 80 GB PCIe (Hopper)", "cuda", 80 * GIB, 9.0, 2000, 2.49),
        HardwareProfile("h100-nvl", "NVIDIA H100 NVL 94 GB (Hopper)", "cuda", 94 * 10**9, 9.0, 3900, 2.79),
        # H200 datasheet: SXM and NVL 141 GB HBM3e, 4.8 TB/s; 9.0
        HardwareProfile("h200", "NVIDIA H200 141 GB SXM (Hopper)", "cuda", 141 * 10**9, 9.0, 4800, 3.79),
        HardwareProfile("h200-nvl", "NVIDIA H200 NVL 141 GB (Hopper)", "cuda", 141 * 10**9, 9.0, 4800, 3.59),
        # GH200 Grace Hopper datasheet: 96 GB HBM3, 4 TB/s, or 144 GB HBM3e, 4.9 TB/s (GPU memory); 9.0
        HardwareProfile("gh200", "NVIDIA GH200 96 GB HBM3 (Grace Hopper)", "cuda", 96 * 10**9, 9.0, 4000, 1.49),
        HardwareProfile(
            "gh200-144gb", "NVIDIA GH200 144 GB HBM3e (Grace Hopper)", "cuda", 144 * 10**9, 9.0, 4900, 1.99
        ),
        # HGX B200 datasheet: 180 GB HBM3e, 8 TB/s per GPU; Blackwell, 10.0
        HardwareProfile("b200", "NVIDIA B200 180 GB (Blackwell)", "cuda", 180 * 10**9, 10.0, 8000, 4.99),
        HardwareProfile("cpu", "CPU only (nominal DDR bandwidth)", "cpu", None, None, 40, 0.10),
    )
}

# The profile of each card, by the name NVML gives it, matched exactly: an "NVIDIA L40S" is not an L4,
# an "NVIDIA H100 PCIe" is not the SXM card. A name not here gets NVML's own figures and no price.
NVML_NAMES: dict[str, str] = {
    "Tesla T4": "t4",
    "NVIDIA A10G": "a10g",
    "NVIDIA A10": "a10",
    "NVIDIA L4": "l4",
    "NVIDIA L40": "l40",
    "NVIDIA L40S": "l40s",
    "NVIDIA RTX A6000": "a6000",
    "NVIDIA RTX 6000 Ada Generation": "rtx6000-ada",
    "NVIDIA GeForce RTX 4090": "rtx4090",
    "NVIDIA A100-SXM4-40GB": "a100-40gb",
    "NVIDIA A100-PCIE-40GB": "a100-40gb-pcie",
    "NVIDIA A100-SXM4-80GB": "a100-80gb",
    "NVIDIA A100 80GB PCIe": "a100-80gb-pcie",
    "NVIDIA H100 80GB HBM3": "h100",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H100 NVL": "h100-nvl",
    "NVIDIA H200": "h200",
    "NVIDIA H200 NVL": "h200-nvl",
    "NVIDIA GH200 480GB": "gh200",
    "NVIDIA GH200 144G HBM3e": "gh200-144gb",
    "NVIDIA B200": "b200",
}
DETECTED = "detected"  # the profile name of a card with no named profile
NO_PROFILE = "no profile for this card: using NVML's own figures"


@dataclass(frozen=True)
class DetectedDevice:
    """A GPU as NVML answers for it: every fact detection reads from the driver (read_nvml asks for them)."""

    name: str  # nvmlDeviceGetName
    memory_bytes: int  # nvmlDeviceGetMemoryInfo().total
    compute_capability: float  # nvmlDeviceGetCudaComputeCapability, major.minor
    bus_width_bits: int | None  # nvmlDeviceGetMemoryBusWidth; None where NVML has no answer
    max_memory_clock_mhz: int | None  # nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM)
    driver: str = ""  # nvmlSystemGetDriverVersion

    @property
    def bandwidth_gb_s(self) -> float | None:
        """Peak memory bandwidth: bytes per transfer across the bus, two transfers per memory clock."""
        if not self.bus_width_bits or not self.max_memory_clock_mhz:
            return None
        return self.bus_width_bits / 8 * self.max_memory_clock_mhz * 2 / 1000

    def profile_name(self) -> str | None:
        """The named profile of this card (its NVML name, exactly), or None."""
        return NVML_NAMES.get(self.name.strip())


def profile_for(detected: DetectedDevice) -> tuple[HardwareProfile, str]:
    """The profile of a detected card and why it was chosen: NVML's memory, compute capability and bandwidth,
    with the display name and price of the named profile whose NVML name is exactly the card's."""
    name = detected.profile_name()
    if name is None:
        bandwidth = detected.bandwidth_gb_s or 0.0  # 0: no roofline
        memory, capability = detected.memory_bytes, detected.compute_capability
        return HardwareProfile(DETECTED, detected.name, "cuda", memory, capability, bandwidth, None), NO_PROFILE
    named = PROFILES[name]
    why = f"exact name match: NVML's {detected.name!r} is profile {name}"
    if detected.bandwidth_gb_s is None:
        why += f" (NVML gave no bus width or memory clock: the bandwidth is the datasheet's {named.bandwidth_gb_s:g})"
    profile = replace(
        named,
        memory_bytes=detected.memory_bytes,
        compute_capability=detected.compute_capability,
        bandwidth_gb_s=detected.bandwidth_gb_s or named.bandwidth_gb_s,
    )
    return profile, why


def read_nvml(index: int) -> DetectedDevice | None:
    """NVML's answers for the GPU at this index, or None when there is no usable NVIDIA GPU there.

    The only place that asks NVML about a card; tests replace it with answers recorded from real cards.
    """
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
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return DetectedDevice(
            name=_text(pynvml.nvmlDeviceGetName(handle)),
            memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
            compute_capability=float(f"{major}.{minor}"),
            bus_width_bits=_answer(pynvml, lambda: pynvml.nvmlDeviceGetMemoryBusWidth(handle)),
            max_memory_clock_mhz=_answer(
                pynvml, lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
            ),
            driver=_text(pynvml.nvmlSystemGetDriverVersion()),
        )
    except pynvml.NVMLError as error:
        log.debug("NVML query failed: %s", error)
        return None
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _answer(pynvml: Any, ask: Callable[[], int]) -> int | None:
    """NVML's answer, or None where this card or driver has none (some report no bus width)."""
    try:
        return int(ask()) or None
    except pynvml.NVMLError:
        return None


def detect_gpu(index: int = 0) -> DetectedDevice | None:
    """The GPU at this index as NVML sees it, or None when there is no usable NVIDIA GPU."""
    return read_nvml(index)


def detect_gpus() -> list[tuple[int, DetectedDevice]]:
    """Every GPU NVML sees here, with its index, up to the first index it has none for."""
    found = []
    for index in itertools.count():
        detected = detect_gpu(index)
        if detected is None:
            return found
        found.append((index, detected))
    return found


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


class _ThisMachine:
    """The machine this process runs on, as rules.Host: what NVML and the trial worker's probe answer."""

    def visible_gpus(self) -> int:
        return visible_gpu_count()

    def bf16_changes_fp32_matmuls(self) -> bool:
        return bf16_changes_fp32_matmuls()


THIS_MACHINE = _ThisMachine()


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

    profile: HardwareProfile
    device: str
    detected: DetectedDevice | None
    note: str | None

    @property
    def bandwidth_gb_s(self) -> float:
        """The peak bandwidth the roofline divides by: the card trials run on (NVML's), else the profile's."""
        measured_on = self.detected.bandwidth_gb_s if self.detected and self.device.startswith("cuda") else None
        return measured_on or self.profile.bandwidth_gb_s


def resolve_hardware(gpu: str, device: str | None) -> ResolvedHardware:
    """Pick the profile (`--gpu`, or detect with 'auto') and check it against `--device`."""
    detected = _detect(device)
    if gpu == "auto":
        return hardware_for(profile_for(detected)[0] if detected else PROFILES["cpu"], device, detected)
    if gpu not in PROFILES:
        raise UserError(f"unknown --gpu {gpu!r}; choose one of: auto, {', '.join(PROFILES)} (see `autotune gpus`)")
    if detected is not None and detected.profile_name() == gpu:
        return hardware_for(profile_for(detected)[0], device, detected)  # this very card: NVML's figures
    return hardware_for(PROFILES[gpu], device, detected)


def hardware_for(
    profile: HardwareProfile, device: str | None, detected: DetectedDevice | None = None
) -> ResolvedHardware:
    """Run trials for `profile` on `device` (a worker joining a study gets the study's profile)."""
    detected = detected if detected is not None else _detect(device)
    if profile.device_type == "cuda" and detected is None:
        raise UserError(
            f"profile {profile.name} needs a CUDA GPU, but none was found here; "
            "use --gpu cpu or run on a machine with a GPU"
        )
    if device is None or device == "cuda":  # torch.cuda.set_device needs an index: plain cuda is the first GPU
        device = "cpu" if profile.device_type == "cpu" else "cuda:0"
    return ResolvedHardware(profile, device, detected, _mismatch_note(profile, detected))


def _detect(device: str | None) -> DetectedDevice | None:
    if device is not None and not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
        raise UserError(f"--device {device!r} is not a device: use cpu, cuda or cuda:N")
    if device == "cpu" or os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return None
    return detect_gpu(device_index(device or "cuda"))


def _mismatch_note(profile: HardwareProfile, detected: DetectedDevice | None) -> str | None:
    """What a profile other than this card's means for the trials, said once; None when it is this card's."""
    if profile.device_type != "cuda" or detected is None:
        return None
    own = profile_for(detected)[0]
    if own.name == profile.name and (profile.name != DETECTED or profile.description == detected.name):
        return None
    capped = (
        f", GPU memory is capped at its {profile.memory_bytes / GIB:.0f} GiB"
        if profile.memory_bytes is not None and profile.memory_bytes < detected.memory_bytes
        else ""
    )
    bandwidth = detected.bandwidth_gb_s
    roofline = f", and the roofline uses this GPU's {bandwidth:.0f} GB/s" if bandwidth else ""
    return (
        f"--gpu {profile.name} ({profile.description}) differs from this machine's {detected.name}: "
        f"knobs are pruned for {profile.name}{capped}; speed is measured on this GPU{roofline}"
    )
