"""Run one worker task in its own process, with a hard timeout, and read back its result.

A worker that crashes, hangs, or writes no result costs one task: the caller always gets a
TaskResult. The worker runs in a new session, so a timeout kills it and every child it started
(kill_tree.py). On a CPU it is forked from the fork server (fork_client.py), else spawned.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autotune.process import fork_client, phases
from autotune.process.kill_tree import Child, kill_leftovers, kill_tree
from autotune.process.life import worker_child_environment
from autotune.process.results import Outcome, TaskResult, TaskSpec, write_json_atomically
from autotune.units import format_bytes, format_duration

POLL_S = 0.25
LOG_TAIL_CHARS = 4000


@dataclass(frozen=True)
class Limits:
    timeout_s: float  # the task's own limit
    deadline: float | None = None  # time.monotonic() at which the study's budget ends


def run_in_worker(
    spec: TaskSpec,
    workdir: Path,
    limits: Limits,
    on_tick: Callable[[], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> TaskResult:
    """Run `spec` in a worker process; call on_start with its pid, then on_tick about every POLL_S seconds,
    and on_phase with each phase the worker announces in its log (autotune.process.phases).

    The worker is forked by the fork server when it runs, else spawned (`python -m autotune.worker`).
    Must be called from a thread that outlives the task: the worker is killed when its parent thread ends.
    """
    spec_path, result_path, log_path = workdir / "spec.json", workdir / "result.json", workdir / "worker.log"
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        result_path.unlink(missing_ok=True)
        write_json_atomically(spec_path, spec.to_json())
    except OSError as error:  # a full disk, a folder that cannot be written: this task fails, not the study
        return TaskResult(Outcome.ERROR, f"cannot write the task's files in {workdir}: {error.strerror}", phase="start")
    forked = (
        fork_client.FORK_SERVER.launch(spec_path, result_path, log_path) if fork_client.forkable(spec.device) else None
    )
    process = forked or _spawn(spec_path, result_path, log_path)
    started = time.monotonic()  # after the fork server's own start (imports once for every task), not before
    try:
        with contextlib.suppress(OSError):  # a full disk: the pid is recorded with the trial anyway (on_start)
            (workdir / "worker.pid").write_text(str(process.pid))
        if on_start is not None:
            on_start(process.pid)
        stopped = _wait(process, started, limits, _watching(log_path, on_phase, on_tick))
    except BaseException:
        kill_tree(process)
        raise
    finally:
        kill_leftovers(process)
    result = _interpret(process, stopped, result_path, limits)
    result.pid = result.pid or process.pid
    result.exit_code = process.returncode
    result.timings.setdefault("wall", time.monotonic() - started)
    if not result.ok:
        result.log_tail = _tail(log_path)
        result.message = _with_full_disk(result, workdir)
    return result


FULL_BELOW_BYTES = 64 * 1024  # a disk with less free space cannot take a task's log and result


def _with_full_disk(result: TaskResult, workdir: Path) -> str:
    """A result the worker could not write, or could write only in part, on a full disk says so first."""
    try:
        free = shutil.disk_usage(workdir).free
    except OSError:
        return result.message
    said = "No space left on device" in result.log_tail or "No space left on device" in result.message
    if result.outcome not in (Outcome.CRASHED, Outcome.ERROR) or not (said or free < FULL_BELOW_BYTES):
        return result.message
    where = f"{format_bytes(free)} free where the task writes its files ({workdir})"
    return f"no space left on device: {where}; {result.message}"


def _watching(
    log_path: Path, on_phase: Callable[[str], None] | None, on_tick: Callable[[], None] | None
) -> Callable[[], None] | None:
    """on_tick, preceded by reading the phases the worker announced since the last tick."""
    if on_phase is None:
        return on_tick
    watcher = PhaseWatcher(log_path, on_phase)

    def tick() -> None:
        watcher.poll()
        if on_tick is not None:
            on_tick()

    return tick


class PhaseWatcher:
    """Reads a growing worker log and reports each phase line once."""

    def __init__(self, log_path: Path, on_phase: Callable[[str], None]) -> None:
        self.log_path = log_path
        self.on_phase = on_phase
        self.offset = 0
        self.partial = b""

    def poll(self) -> None:
        try:
            with self.log_path.open("rb") as log_file:
                log_file.seek(self.offset)
                data = log_file.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            name = phases.parse(line.decode(errors="replace"))
            if name is not None:
                self.on_phase(name)


def _spawn(spec_path: Path, result_path: Path, log_path: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "autotune.worker", str(spec_path), str(result_path)]
    with log_path.open("wb") as log_file:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=worker_child_environment(),
        )


def _wait(process: Child, started: float, limits: Limits, on_tick: Callable[[], None] | None) -> Outcome | None:
    """Wait for the worker; stop it at its timeout or at the budget's deadline and say which."""
    while True:
        try:
            process.wait(timeout=POLL_S)
            return None
        except subprocess.TimeoutExpired:
            pass
        if on_tick is not None:
            on_tick()
        now = time.monotonic()
        if limits.deadline is not None and now >= limits.deadline:
            kill_tree(process)
            return Outcome.BUDGET
        if now - started >= limits.timeout_s:
            kill_tree(process)
            return Outcome.TIMEOUT


def _interpret(process: Child, stopped: Outcome | None, result_path: Path, limits: Limits) -> TaskResult:
    if stopped == Outcome.TIMEOUT:
        return TaskResult(
            Outcome.TIMEOUT,
            f"no result within the trial timeout of {format_duration(limits.timeout_s)}; "
            "the worker and its children were killed",
        )
    if stopped == Outcome.BUDGET:
        return TaskResult(Outcome.BUDGET, "stopped when the study's budget ran out")
    code = process.returncode
    if result_path.exists():
        try:
            return TaskResult.from_json(json.loads(result_path.read_text()))
        except (ValueError, KeyError, TypeError) as error:
            return TaskResult(Outcome.CRASHED, f"the worker wrote a malformed result ({error}); exit status {code}")
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        hint = " (the kernel's out-of-memory killer sends SIGKILL)" if name == "SIGKILL" else ""
        return TaskResult(Outcome.CRASHED, f"the worker was killed by {name}{hint}")
    return TaskResult(Outcome.CRASHED, f"the worker exited with status {code} without a result")


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as file:
            file.seek(max(0, path.stat().st_size - LOG_TAIL_CHARS))
            return file.read().decode(errors="replace")
    except OSError:
        return ""
