"""The runner against real worker processes that fail for real: exceptions, hangs, signals, bad output."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from autotune.for_tests import Fault
from autotune.process.results import Candidate, Outcome, TaskSpec
from autotune.process.runner import Limits, run_in_worker
from autotune.space import Plan
from autotune.specs import ModelSpec

CHILD_MARKER = "autotune-fault-child"


def faulty_spec(tmp_path: Path, kind: str, phase: str = "load") -> TaskSpec:
    return TaskSpec(
        task="trial",
        model=ModelSpec("demo", path=str(tmp_path / "no-model")),
        device="cpu",
        cache_dir=str(tmp_path / "cache"),
        candidate=Candidate({"dtype": "float32"}, Plan()),
        reference_path=str(tmp_path / "no-reference.pt"),
        fault=Fault(kind, phase),
    )


def test_an_exception_in_the_worker_is_an_error_with_its_message_and_phase(tmp_path):
    result = run_in_worker(faulty_spec(tmp_path, "raise"), tmp_path / "w", Limits(timeout_s=120))
    assert result.outcome == Outcome.ERROR
    assert result.phase == "load"
    assert "RuntimeError: injected failure" in result.message
    assert "injected failure" in result.log_tail  # the worker's traceback is kept for the report
    assert result.pid and result.pid != os.getpid()


def test_an_allocation_that_cannot_be_served_is_an_oom(tmp_path):
    result = run_in_worker(faulty_spec(tmp_path, "oom", phase="start"), tmp_path / "w", Limits(timeout_s=120))
    assert result.outcome == Outcome.OOM, result.message
    assert "memory" in result.message.lower()


def _fault_children() -> list[psutil.Process]:
    """The fault's children this checkout's Python started (another checkout's tests may run beside these)."""
    return [
        p
        for p in psutil.process_iter(["cmdline"])
        if CHILD_MARKER in " ".join(p.info["cmdline"] or []) and p.info["cmdline"][0] == sys.executable
    ]


def _running(pids: set[int]) -> list[int]:
    """The processes among `pids` that still run (a killed one is gone, or a zombie until it is reaped)."""
    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.Error:
            continue
    return running


def test_a_hanging_worker_is_killed_with_its_children_at_the_timeout(tmp_path):
    seen_children: set[int] = set()
    spec = faulty_spec(tmp_path, "hang_with_child", phase="start")
    result = run_in_worker(
        spec,
        tmp_path / "w",
        Limits(timeout_s=8),
        on_tick=lambda: seen_children.update(p.pid for p in _fault_children()),
    )
    assert result.outcome == Outcome.TIMEOUT
    assert "trial timeout" in result.message
    # From the worker's launch (not the test's start: a fork server this process starts first imports torch).
    assert result.timings["wall"] < 8 + 10
    assert seen_children, "the worker never started its child, so the test proves nothing"
    gone_by = time.monotonic() + 10  # killed with SIGKILL: only their reaping can lag
    while survivors := _running(seen_children):
        assert time.monotonic() < gone_by, f"a child of the killed worker survived: {survivors}"
        time.sleep(0.1)
    assert not psutil.pid_exists(result.pid) or psutil.Process(result.pid).status() == psutil.STATUS_ZOMBIE


def test_the_budget_deadline_stops_a_running_worker(tmp_path):
    deadline = time.monotonic() + 6
    result = run_in_worker(faulty_spec(tmp_path, "hang", phase="start"), tmp_path / "w", Limits(600, deadline))
    ended = time.monotonic()
    assert result.outcome == Outcome.BUDGET
    launched = ended - result.timings["wall"]  # after the deadline, where a fork server had to start first
    assert ended - max(deadline, launched) < 6


def test_a_worker_killed_from_outside_is_crashed(tmp_path):
    worker: list[int] = []
    killed: list[int] = []

    def kill_worker_once_started() -> None:
        if not killed and worker and time.monotonic() - started > 2:
            os.kill(worker[0], signal.SIGKILL)
            killed.append(worker[0])

    started = time.monotonic()
    spec = faulty_spec(tmp_path, "hang", phase="start")
    result = run_in_worker(
        spec, tmp_path / "w", Limits(timeout_s=120), on_tick=kill_worker_once_started, on_start=worker.append
    )
    assert killed and result.pid == killed[0]
    assert result.outcome == Outcome.CRASHED
    assert "SIGKILL" in result.message


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("exit", "exited with status 3 without a result"),
        ("segfault", "killed by SIGSEGV"),
        ("garbage", "malformed result"),
    ],
)
def test_a_worker_that_dies_or_writes_no_valid_result_is_crashed(tmp_path, kind, message):
    result = run_in_worker(faulty_spec(tmp_path, kind, phase="start"), tmp_path / "w", Limits(timeout_s=120))
    assert result.outcome == Outcome.CRASHED
    assert message in result.message


def test_a_missing_model_fails_in_the_load_phase_as_an_error(tmp_path):
    spec = faulty_spec(tmp_path, "raise", phase="quality")  # the fault is never reached
    result = run_in_worker(spec, tmp_path / "w", Limits(timeout_s=120))
    assert result.outcome == Outcome.ERROR
    assert result.phase == "load"
