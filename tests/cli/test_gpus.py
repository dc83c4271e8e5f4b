"""`autotune gpus` says what NVML answered for each card, the bandwidth computed from it, and the profile chosen."""

from autotune.cli.printers import detection_lines
from autotune.profiles import DetectedDevice

MIB = 1024**2


def test_a_card_with_a_profile_shows_nvmls_answers_the_bandwidth_and_the_exact_match():
    l40s = DetectedDevice("NVIDIA L40S", 46068 * MIB, 8.9, 384, 9001, "570.195.03")
    assert detection_lines(0, l40s) == [
        "detected here, GPU 0 (NVML): NVIDIA L40S, 45.0 GiB, compute capability 8.9, 384-bit memory bus, "
        "9001 MHz max memory clock -> 864 GB/s peak bandwidth (384 bits / 8 x 9001 MHz x 2 transfers per clock)",
        "  profile l40s (exact name match: NVML's 'NVIDIA L40S' is profile l40s): "
        "NVML's figures, the profile's name and price",
    ]


def test_a_card_without_a_profile_says_it_uses_nvmls_own_figures():
    a30 = DetectedDevice("NVIDIA A30", 24060 * MIB, 8.0, 3072, 1215)
    assert detection_lines(1, a30)[1] == (
        "  profile detected (no profile for this card: using NVML's own figures): its own figures, no price"
    )


def test_missing_nvml_answers_are_said_and_no_bandwidth_is_made_up():
    card = DetectedDevice("NVIDIA A30", 24060 * MIB, 8.0, None, None)
    assert detection_lines(0, card)[0].endswith(
        "no memory bus width from NVML, no max memory clock from NVML -> no bandwidth computed"
    )
