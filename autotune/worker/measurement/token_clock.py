"""When each generated token was produced, without making the host wait for the device between tokens.

On CUDA each token gets an event recorded on the device's current stream; the events are read once, after the
call, so generate() queues its steps as it does when deployed. Elsewhere (a CPU runs each step before the host
goes on) the host's clock is read at each token.
"""

from __future__ import annotations

import time
from typing import Any

import torch


def synchronize(device: torch.device) -> None:
    """Wait until the device has run everything queued on it (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TokenClock:
    """Marks each token as it is produced; as a stopping criterion of generate() it never stops generation.

    start() before the call, a mark per token (the criterion's call, or mark()), stop() after it: the device is
    waited for at start() and at stop(), never in between. times() then reads the marks.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.marks: list[Any] = []
        self.origin: Any = None
        self.never: torch.Tensor | None = None  # what the criterion returns, made once per call

    def start(self) -> float:
        """Wait for the device, then return the host time from which the token times count."""
        synchronize(self.device)
        started = time.perf_counter()
        self.origin = self._event()
        return started

    def stop(self) -> float:
        """Wait for the device, then return the host time: the end of the call."""
        synchronize(self.device)
        return time.perf_counter()

    def mark(self) -> None:
        self.marks.append(self._event() if self.device.type == "cuda" else time.perf_counter())

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        self.mark()
        if self.never is None or self.never.shape[0] != input_ids.shape[0]:
            self.never = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        return self.never

    def times(self, started: float) -> list[float]:
        """Each token's time on the host clock of `started` (after stop())."""
        if self.device.type != "cuda":
            return list(self.marks)
        return [started + self.origin.elapsed_time(event) / 1e3 for event in self.marks]

    def _event(self) -> Any:
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event
