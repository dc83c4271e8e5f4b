"""Memory: a trial's peak, in bytes as measured and in GB as a study compares it."""

from __future__ import annotations

from autotune.figures.metrics.metric import BYTES, COLUMN, FRONT, Metric

PEAK_MEMORY_BYTES = "peak_memory_bytes"  # peak memory in bytes: PEAK_MEMORY is the same in GB
PEAK_MEMORY = Metric(
    "peak_memory_gb",
    "peak memory",
    "GB",
    "minimize",
    short="peak memory",
    axis="peak memory (GB)",
    shown=FRONT,
    column="memory",
    cell=BYTES,
    cell_of=PEAK_MEMORY_BYTES,
    line="{}",
    compared=COLUMN,
    aliases=(("memory", "gb"), ("mem", "gb"), ("peak_memory", "gb")),
    forecast="memory",
)
