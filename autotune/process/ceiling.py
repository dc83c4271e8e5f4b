"""The decode ceiling task (`autotune ceiling`): what the hand-written decoding loop is asked to measure, and what it
measured at each batch. The worker runs it (autotune.worker.ceiling); a study stores its figures
(autotune.study.ceilings) and the report sets the best trial against them (autotune.report.ceiling)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CeilingSpec:
    """The hand loop's part of a ceiling task's spec; the model, device and bandwidth are the task's own."""

    dtype: str  # torch dtype of the weights
    compile: str  # torch.compile mode of the decode step, or off
    batch_sizes: tuple[int, ...]
    input_len: int
    output_len: int
    warmup: int  # untimed calls first (the first compiles)
    min_iterations: int
    min_seconds: float
    study_device_name: str | None = None  # the device the study to store with searched on: another is refused

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CeilingSpec:
        return cls(**{**data, "batch_sizes": tuple(data["batch_sizes"])})


@dataclass(frozen=True)
class Ceiling:
    """The hand loop's figures at one batch size; what a study stores (autotune.study.ceilings)."""

    model: str  # as given: demo, a folder or a hub id
    device: str
    device_name: str
    dtype: str
    compile: str  # torch.compile mode of the decode step, or off
    batch_size: int
    input_len: int
    output_len: int
    decode_tok_s: float  # median over iterations
    decode_tok_s_cv: float
    iterations: int
    achieved_bandwidth_gb_s: float
    roofline_fraction: float  # of the profile's peak
    peak_bandwidth_gb_s: float
    copy_bandwidth_gb_s: float  # measured here: a device-to-device copy, bytes read + written per second
    torch: str
    transformers: str
    measured_at: str  # when its iterations ended (a figure can be stored with a study later)

    @property
    def copy_fraction(self) -> float:
        return self.achieved_bandwidth_gb_s / self.copy_bandwidth_gb_s

    def line(self) -> str:
        return (
            f"hand loop, batch {self.batch_size}, {self.dtype}, compile {self.compile}: {self.decode_tok_s:.1f} tok/s "
            f"(cv {self.decode_tok_s_cv:.1%}, {self.iterations} runs), {self.roofline_fraction:.1%} of the "
            f"{self.peak_bandwidth_gb_s:g} GB/s roofline ({self.achieved_bandwidth_gb_s:.2f} GB/s; measured copy "
            f"bandwidth {self.copy_bandwidth_gb_s:.1f} GB/s, {self.copy_fraction:.1%} of it)"
        )


def utc_minute() -> str:
    """Now, as a ceiling's `measured_at` and `stored_at` say it."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
