import pytest

from autotune.errors import UserError
from autotune.paths import PACKAGED_SPACE
from autotune.profiles import PROFILES, DetectedDevice, resolve_hardware
from autotune.space import load_space

SPACE = load_space(PACKAGED_SPACE)


def values(space, knob):
    return set(space.knob(knob).values)


def test_every_profile_has_the_figures_the_report_needs():
    for name in ("t4", "a10g", "l4", "a100-40gb", "a100-80gb", "h100", "h200", "cpu"):
        profile = PROFILES[name]
        assert profile.bandwidth_gb_s > 0 and profile.price_per_hour is not None
        assert (profile.kind == "cuda") == (profile.compute_capability is not None)


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


def test_detected_names_map_to_profiles():
    def device(name):
        return DetectedDevice(name, 0, 9.0, None, "")

    assert device("NVIDIA H100 80GB HBM3").matching_profile() == "h100"
    assert device("NVIDIA H200").matching_profile() == "h200"
    assert device("NVIDIA A100-SXM4-80GB").matching_profile() == "a100-80gb"
    assert device("NVIDIA A100-SXM4-40GB").matching_profile() == "a100-40gb"
    assert device("NVIDIA A10G").matching_profile() == "a10g"
    assert device("Tesla T4").matching_profile() == "t4"
    assert device("NVIDIA RTX 6000 Ada").matching_profile() is None


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
