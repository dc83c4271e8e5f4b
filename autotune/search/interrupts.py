"""Ctrl-C, SIGINT and SIGTERM to `autotune search` or `autotune worker`: unwind, record, say so, exit 130 / 143.

Typer turns KeyboardInterrupt into its own exit before a handler around the app sees it, so the
commands install their own signal handlers. The handler raises Interrupted, which no library
catches: the runner kills the trial's process group on the way out, the trial loop records the
running trial as failed with the reason `interrupted` (queued to be retried once), and the CLI
prints what the study kept and how to resume. Storage writes that belong together run in
`deferred()`, so a signal never cuts them in half; signals after the first are ignored while
unwinding, which takes a few seconds at most.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

from autotune.errors import StorageUnavailableError, UserError

HANDLED = (signal.SIGINT, signal.SIGTERM)
SUMMARY_PATIENCE_S = 2.0  # how long the line said on the way out waits for a storage that does not answer


class Interrupted(BaseException):
    """A signal stopped the run. Filled in while unwinding: the trial it cut short and the study."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.trial: int | None = None
        self.study: StudyPlace | None = None

    @property
    def exit_status(self) -> int:
        return 128 + self.signum  # 130 for SIGINT, 143 for SIGTERM, as shells report them


@dataclass(frozen=True)
class StudyPlace:
    name: str
    storage_url: str


@dataclass
class _State:
    depth: int = 0  # nesting of deferred()
    pending: int | None = None  # a signal that came during deferred()
    seen: int | None = None  # the first signal: later ones are ignored while unwinding


_state = _State()


def install() -> None:
    """Make SIGINT and SIGTERM raise Interrupted in the main thread (call once per command)."""
    _state.depth, _state.pending, _state.seen = 0, None, None
    for signum in HANDLED:
        signal.signal(signum, _handle)


def _handle(signum: int, frame: FrameType | None) -> None:
    if _state.seen is not None:
        return
    _state.seen = signum
    if _state.depth:
        _state.pending = signum
        return
    raise Interrupted(signum)


@contextmanager
def deferred() -> Iterator[None]:
    """Run a block that must not be cut in half; a signal that arrives meanwhile is raised after it."""
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
    if _state.depth == 0 and _state.pending is not None:
        signum, _state.pending = _state.pending, None
        raise Interrupted(signum)


def signalled() -> bool:
    """Whether a signal asked this process to stop (raised already, or waiting for deferred() to end): a wait for
    the storage ends at its next try."""
    return _state.seen is not None


def pending_exit_status() -> int | None:
    """The exit status of a signal that came and was not raised (the run ended another way meanwhile)."""
    return None if _state.seen is None else 128 + _state.seen


def summary(interrupt: Interrupted) -> str:
    """The line the CLI prints: what was kept, what happened to the running trial, how to resume."""
    name = signal.Signals(interrupt.signum).name
    parts = [f"interrupted by {name}"]
    if interrupt.trial is not None:
        parts.append(f"trial #{interrupt.trial} was recorded as failed (interrupted) and is retried once on resume")
    if interrupt.study is not None:
        parts.append(_kept(interrupt.study))
    else:
        parts.append("no study was stored yet")
    return "; ".join(parts) + "; run the same command again to resume"


def _kept(place: StudyPlace) -> str:
    from autotune import study as studies

    where = studies.redact(place.storage_url)
    try:
        stored = studies.load_stored_study(place.storage_url, place.name, studies.Waiting(SUMMARY_PATIENCE_S))
        finished = [record for record in studies.records(stored) if record.launched and record.outcome]
    except UserError as error:
        if not str(error).startswith("no study named"):
            return f"study {place.name} in {where} could not be read just now: {error}"
        return f"nothing was stored in {where} yet"  # never created: nothing to resume but the command itself
    except StorageUnavailableError:
        return f"study {place.name} in {where} could not be read just now (its storage is unavailable)"
    complete = sum(1 for record in finished if record.complete)
    return f"study {place.name} keeps its {len(finished)} recorded trials ({complete} complete) in {where}"
