import pytest

from autotune import fpmath_probe, profiles
from autotune.errors import UserError
from autotune.paths import PACKAGED_SPACE
from autotune.profiles import (
    NO_PROFILE,
    PROFILES,
    DetectedDevice,
    HardwareProfile,
    hardware_for,
    profile_for,
    resolve_hardware,
)
from autotune.space import load_space

SPACE = load_space(PACKAGED_SPACE)


def values(space, knob):
    return set(space.knob(knob).values)


def test_every_profile_has_the_figures_the_report_needs():
    for name in ("t4", "a10g", "l4", "a100-40gb", "a100-80gb", "h100", "h200", "cpu"):  # every name kept
        assert name in PROFILES
    for profile in PROFILES.values():
        assert profile.bandwidth_gb_s > 0 and profile.price_per_hour is not None
        assert (profile.device_type == "cuda") == (profile.compute_capability is not None)


def test_t4_loses_bfloat16_and_flash_attention():
    space = SPACE.prune(PROFILES["t4"].why_not_value)
    assert "bfloat16" not in values(space, "dtype")
    assert not values(space, "attn_implementation") & {"flash_attention_2", "flash_attention_3"}
    assert "kernels-community/flash-attn2" in values(space, "attn_implementation")
    assert "Ampere" in space.removed["attn_implementation"]["flash_attention_2"]


def test_flash_attention_3_only_on_hopper():
    for name in ("a10g", "l4", "a100-80gb"):
        assert "flash_attention_3" not in values(SPACE.prune(PROFILES[name].why_not_value), "attn_implementation")
    for name in ("h100", "h200"):
        assert "flash_attention_3" in values(SPACE.prune(PROFILES[name].why_not_value), "attn_implementation")


def test_cpu_loses_every_cuda_only_value_and_keeps_the_rest():
    space = SPACE.prune(PROFILES["cpu"].why_not_value)
    assert values(space, "attn_implementation") == {"sdpa", "eager", "flex_attention"}
    assert values(space, "cache_implementation") == {"dynamic", "static", "quantized"}
    assert values(space, "compile") == {"off", "default"}
    assert values(space, "dtype") == {"float32", "bfloat16", "float16"}
    assert "CUDA" in space.removed["cache_implementation"]["offloaded"]


def test_pruned_values_explain_themselves_when_sampled():
    space = SPACE.prune(PROFILES["t4"].why_not_value)
    config = {"dtype": "bfloat16", "attn_implementation": "sdpa", "quantization": "none", "batching": "continuous"}
    assert "bfloat16 needs compute capability 8.0" in space.violation(config)


MIB = 1024**2


def nvml(name: str, mib: int, capability: float, bus_bits: int, clock_mhz: int) -> DetectedDevice:
    """NVML's answers for one card: name, total memory (MiB), compute capability, bus width, max memory clock."""
    return DetectedDevice(name, mib * MIB, capability, bus_bits, clock_mhz, "570.195.03")


# Recorded from real cards: names and totals as nvidia-smi prints them (memory.total, MiB); bus widths and
# max memory clocks where a public nvidia-smi, deviceQuery or nvbench print shows them ("seen"), else the
# clock that the NVIDIA datasheet bandwidth implies on that bus ("datasheet").
CARDS = [  # reading, profile auto picks, bandwidth computed from NVML's answers (GB/s)
    (nvml("Tesla T4", 15360, 7.5, 256, 5001), "t4", 320.1),  # seen
    (nvml("NVIDIA A10G", 23028, 8.6, 384, 6251), "a10g", 600.1),  # seen
    (nvml("NVIDIA A10", 23028, 8.6, 384, 6251), "a10", 600.1),  # seen
    (nvml("NVIDIA L4", 23034, 8.9, 192, 6251), "l4", 300.0),  # seen
    (nvml("NVIDIA L40S", 46068, 8.9, 384, 9001), "l40s", 864.1),  # memory seen; clock: datasheet 864 GB/s
    (nvml("NVIDIA L40", 46068, 8.9, 384, 9001), "l40", 864.1),  # clock: datasheet 864 GB/s
    (nvml("NVIDIA RTX A6000", 49140, 8.6, 384, 8001), "a6000", 768.1),  # clock: datasheet 768 GB/s
    (nvml("NVIDIA RTX 6000 Ada Generation", 49140, 8.9, 384, 10001), "rtx6000-ada", 960.1),  # clock seen
    (nvml("NVIDIA GeForce RTX 4090", 24564, 8.9, 384, 10501), "rtx4090", 1008.1),  # seen
    (nvml("NVIDIA A100-SXM4-40GB", 40960, 8.0, 5120, 1215), "a100-40gb", 1555.2),  # seen
    (nvml("NVIDIA A100-SXM4-80GB", 81920, 8.0, 5120, 1593), "a100-80gb", 2039.0),  # clock: datasheet 2039 GB/s
    (nvml("NVIDIA A100 80GB PCIe", 81920, 8.0, 5120, 1512), "a100-80gb-pcie", 1935.4),  # seen
    (nvml("NVIDIA H100 PCIe", 81559, 9.0, 5120, 1593), "h100-pcie", 2039.0),  # seen
    (nvml("NVIDIA H100 80GB HBM3", 81559, 9.0, 5120, 2619), "h100", 3352.3),  # seen: the SXM card
    (nvml("NVIDIA H100 NVL", 95830, 9.0, 6144, 2539), "h100-nvl", 3899.9),  # memory seen; clock: datasheet 3.9 TB/s
    (nvml("NVIDIA H200", 143771, 9.0, 6144, 3125), "h200", 4800.0),  # memory seen; clock: datasheet 4.8 TB/s
    (nvml("NVIDIA H200 NVL", 143771, 9.0, 6144, 3125), "h200-nvl", 4800.0),  # memory seen; clock: datasheet
    (nvml("NVIDIA GH200 480GB", 97871, 9.0, 6144, 2604), "gh200", 3999.7),  # memory seen; clock: datasheet 4 TB/s
    (nvml("NVIDIA B200", 183359, 10.0, 7680, 3996), "b200", 7672.3),  # seen (the driver's 7680-bit bus)
    (nvml("NVIDIA A30", 24060, 8.0, 3072, 1215), "detected", 933.1),  # seen: a card with no profile
    (nvml("Quadro GV100", 32507, 7.0, 4096, 850), "detected", 870.4),  # seen: a card with no profile
]


CARD = {card.name: card for card, _, _ in CARDS}


@pytest.mark.parametrize(("card", "name", "bandwidth"), CARDS, ids=[card.name for card, _, _ in CARDS])
def test_a_detected_card_gets_its_exact_profile_with_nvmls_own_figures(card, name, bandwidth):
    profile, why = profile_for(card)
    assert profile.name == name
    assert profile.bandwidth_gb_s == pytest.approx(bandwidth, abs=0.05)
    assert (profile.memory_bytes, profile.compute_capability) == (card.memory_bytes, card.compute_capability)
    if name == "detected":
        assert (profile.description, profile.price_per_hour, why) == (card.name, None, NO_PROFILE)
    else:
        assert profile.price_per_hour == PROFILES[name].price_per_hour
        assert why == f"exact name match: NVML's {card.name!r} is profile {name}"


def test_a_name_is_matched_whole_never_by_a_part_of_it():
    """The old substring rule took an L40S for an L4 (24 GB, 300 GB/s) and an H100 PCIe for the SXM card."""
    assert [nvml(name, 1, 9.0, 1, 1).profile_name() for name in ("NVIDIA L40S", "NVIDIA L4")] == ["l40s", "l4"]
    for lookalike in ("NVIDIA H100", "NVIDIA H100 80GB HBM3e", "NVIDIA L4 Tensor", "H100 PCIe", "NVIDIA H20"):
        assert nvml(lookalike, 1, 9.0, 1, 1).profile_name() is None


def test_a_card_whose_nvml_has_no_bus_width_keeps_its_datasheet_bandwidth_and_says_so():
    card = DetectedDevice("NVIDIA L40S", 46068 * MIB, 8.9, None, 9001)
    profile, why = profile_for(card)
    assert card.bandwidth_gb_s is None and profile.bandwidth_gb_s == 864
    assert why.endswith("(NVML gave no bus width or memory clock: the bandwidth is the datasheet's 864)")


def _machine_with(monkeypatch, card: DetectedDevice) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(profiles, "read_nvml", lambda index: card if index == 0 else None)


def test_auto_on_an_l40s_is_the_l40s_with_nvmls_memory_and_bandwidth(monkeypatch):
    _machine_with(monkeypatch, CARD["NVIDIA L40S"])
    hardware = resolve_hardware("auto", None)
    assert (hardware.profile.name, hardware.profile.memory_bytes, hardware.note) == ("l40s", 46068 * MIB, None)
    assert hardware.bandwidth_gb_s == pytest.approx(864.1, abs=0.05) and hardware.device == "cuda:0"


def test_device_cuda_is_the_first_gpu_with_its_index(monkeypatch):
    """torch.cuda.set_device refuses a bare "cuda" (seen on an H200 with `--device cuda`)."""
    _machine_with(monkeypatch, CARD["NVIDIA L40S"])
    assert resolve_hardware("auto", "cuda").device == "cuda:0"
    assert resolve_hardware("auto", "cuda:0").device == "cuda:0"


def test_naming_the_card_in_the_machine_takes_nvmls_figures_and_says_nothing(monkeypatch):
    _machine_with(monkeypatch, CARD["NVIDIA H100 80GB HBM3"])  # the SXM card
    hardware = resolve_hardware("h100", None)
    assert hardware.note is None and hardware.profile.memory_bytes == 81559 * MIB
    assert hardware.profile.bandwidth_gb_s == pytest.approx(3352.3, abs=0.05)


def test_another_gpu_than_the_cards_is_said_once_and_the_roofline_uses_the_cards_bandwidth(monkeypatch):
    _machine_with(monkeypatch, CARD["NVIDIA H100 PCIe"])  # named as the SXM card
    hardware = resolve_hardware("h100", None)
    assert hardware.profile == PROFILES["h100"] and hardware.bandwidth_gb_s == pytest.approx(2039.0, abs=0.05)
    assert hardware.note == (
        "--gpu h100 (NVIDIA H100 80 GB SXM (Hopper)) differs from this machine's NVIDIA H100 PCIe: knobs are "
        "pruned for h100; speed is measured on this GPU, and the roofline uses this GPU's 2039 GB/s"
    )  # 80 GiB is more than the PCIe card's 81559 MiB: nothing is capped, so the note says no cap


def test_a_smaller_profile_than_the_card_caps_memory_and_says_so(monkeypatch):
    _machine_with(monkeypatch, CARD["NVIDIA H100 PCIe"])
    note = resolve_hardware("l4", None).note or ""
    assert "GPU memory is capped at its 24 GiB" in note and note.endswith("this GPU's 2039 GB/s")


def test_a_card_with_no_profile_is_described_by_nvml_and_joined_without_a_note(monkeypatch):
    _machine_with(monkeypatch, CARD["NVIDIA A30"])
    hardware = resolve_hardware("auto", None)
    assert (hardware.profile.name, hardware.profile.description, hardware.note) == ("detected", "NVIDIA A30", None)
    stored = HardwareProfile.from_json({**hardware.profile.to_json(), "added_later": 1})
    assert hardware_for(stored, None).note is None


def test_auto_is_cpu_without_a_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    hardware = resolve_hardware("auto", None)
    assert hardware.profile.name == "cpu" and hardware.device == "cpu" and hardware.note is None


def test_a_gpu_profile_without_a_gpu_is_bad_input(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(UserError, match="needs a CUDA GPU"):
        resolve_hardware("a10g", None)


def test_unknown_profile_and_device_are_bad_input():
    with pytest.raises(UserError, match="unknown --gpu 'v100'"):
        resolve_hardware("v100", "cpu")
    with pytest.raises(UserError, match="--device 'gpu0'"):
        resolve_hardware("cpu", "gpu0")


def _probe_answering(answer: bool | None, asked: list[int]):
    def run_probe() -> bool | None:
        asked.append(1)
        return answer

    return run_probe


def test_the_bf16_probe_is_asked_once_per_cpu_torch_and_onednn_setting_and_its_answer_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    asked: list[int] = []
    monkeypatch.setattr(fpmath_probe, "_run_probe", _probe_answering(False, asked))
    ask = fpmath_probe.bf16_changes_fp32_matmuls.__wrapped__  # past this process's own cache: the folder's
    assert ask() is False and ask() is False and len(asked) == 1
    kept = (tmp_path / "machine" / "fp32-bf16-matmuls.json").read_text()
    assert fpmath_probe._cpu_description()[0] in kept and "torch " in kept
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # oneDNN told to use less of the CPU: asked again
    assert ask() is False and len(asked) == 2


def test_a_probe_with_no_answer_keeps_the_value_and_is_asked_again(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    asked: list[int] = []
    monkeypatch.setattr(fpmath_probe, "_run_probe", _probe_answering(None, asked))
    ask = fpmath_probe.bf16_changes_fp32_matmuls.__wrapped__
    assert ask() is True and ask() is True and len(asked) == 2
    assert not (tmp_path / "machine").exists()
