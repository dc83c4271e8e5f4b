"""What the command is doing now, with elapsed time: a live line on a terminal, plain lines in a log."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn


class ProgressDisplay:
    """On a terminal, one live line (spinner, phase, time in the phase); otherwise one line per phase,
    stamped with the seconds since the command started, for nightly logs."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.started = time.monotonic()
        self.live: Progress | None = None
        self.task: TaskID | None = None

    def show(self, what: str) -> None:
        if not self.console.is_terminal:
            self.console.print(f"[{time.monotonic() - self.started:6.1f}s] {what}")
            self.console.file.flush()  # a pipe buffers: a log must show the line now
            return
        if self.live is None:
            self.live = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=self.console,
                transient=True,
            )  # fmt: skip
            self.live.start()
            self.task = self.live.add_task(what, total=None)
        else:
            assert self.task is not None
            self.live.reset(self.task, description=what)  # the clock restarts with each phase

    def clear(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live, self.task = None, None
