"""Request traces: what a study's trials replay instead of one uniform shape (--traffic FILE; docs/traffic.md)."""

from autotune.traffic.formats import FORMATS, FORMS, read_trace
from autotune.traffic.requests import (
    BLOCK_TOKENS,
    DEFAULT_WINDOW,
    Trace,
    TraceRequest,
    TrafficRef,
    counted_lengths,
    read_window,
    turns,
    window_path,
)

__all__ = [
    "BLOCK_TOKENS",
    "DEFAULT_WINDOW",
    "FORMATS",
    "FORMS",
    "Trace",
    "TraceRequest",
    "TrafficRef",
    "counted_lengths",
    "read_trace",
    "read_window",
    "turns",
    "window_path",
]
