"""The flags of a request trace every trial replays instead of one shape (--traffic, --traffic-requests), and the
trace they name, read and checked before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autotune.data import DEMO_TRACE
from autotune.errors import UserError
from autotune.traffic import DEFAULT_WINDOW, TrafficRef, read_trace

Traffic = Annotated[
    Path | None,
    typer.Option(
        "--traffic",
        help="A request trace every trial replays instead of one shape: each request with its own input and output "
        "length, and its arrival and conversation where the file has them. A .jsonl of requests (docs/traffic.md), "
        "Mooncake's .jsonl, an Azure LLM inference trace's .csv, ShareGPT conversations (.json), or demo (built in).",
    ),
]
TrafficRequests = Annotated[
    int | None,
    typer.Option(
        "--traffic-requests",
        min=1,
        help="How many requests of the --traffic trace each trial replays, from its first.",
        show_default=f"{DEFAULT_WINDOW}, or all of a shorter trace",
    ),
]


def traffic_ref(
    path: Path | None, requests: int | None, prompts: Path | None, lengths: dict[str, tuple[int, int]]
) -> TrafficRef | None:
    """The trace --traffic names, read and checked now (bad input before anything runs), with the window of it each
    trial replays; None without --traffic. `lengths`: --input-len and --output-len, each with its default."""
    if path is None:
        if requests is not None:
            raise UserError("--traffic-requests goes with --traffic FILE")
        return None
    if prompts is not None:
        raise UserError("--prompts and --traffic both give the prompts: give one of them")
    for flag, (value, default) in lengths.items():  # at its default, a length only shapes the quality check
        if value != default:
            raise UserError(f"{flag} {value}: each request of --traffic has its own lengths; leave out {flag}")
    trace = read_trace(DEMO_TRACE if str(path) == "demo" and not path.exists() else path)
    if requests is not None and requests > len(trace.requests):
        raise UserError(
            f"--traffic-requests {requests}: {trace.name} holds {len(trace.requests)} requests; give at most that"
        )
    return TrafficRef.of(trace, min(requests or DEFAULT_WINDOW, len(trace.requests)))
