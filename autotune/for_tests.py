"""The one switch to what only the tests use (autotune/testing/, docs/ci.md "Test hooks"): the product's modules call
these, one line each where a test may act, and nothing of autotune/testing/ is imported unless a test asked for it:

- AUTOTUNE_INJECT_FAULTS: which trials of a search fail for real, where and how (autotune/testing/faults.py), written
  into each such trial's task spec as its `fault`;
- AUTOTUNE_HOLD_AT: the moments of its life a process is held at, so a test can stop the database exactly then
  (autotune/testing/moments.py);
- a task spec's `fault` (the first variable writes it, a test may write it itself): what the trial worker does to
  fail (autotune/testing/worker_faults.py).

Where neither variable is set and no task spec carries a fault, as always outside the tests, each call returns at once.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

FAULTS_VARIABLE = "AUTOTUNE_INJECT_FAULTS"
HOLD_VARIABLE = "AUTOTUNE_HOLD_AT"


@dataclass(frozen=True)
class Fault:
    """What a test asks the trial worker to do to fail for real (autotune/testing/worker_faults.py does it), carried
    by the task spec: its kind, the phase it strikes as it starts, or the first batch of a capacity probe it strikes
    at, the file whose existence ends a stall, and a slow model's sleep per forward pass."""

    kind: str
    phase: str | None = None
    batch: int | None = None
    until: str | None = None
    seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {name: value for name, value in asdict(self).items() if value is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fault:
        return cls(**data)


def _testing(module: str) -> ModuleType:
    """A module of autotune/testing/, imported by name: the product never imports the tests' package itself."""
    return importlib.import_module(f"autotune.testing.{module}")


# ------------------------------------------------------------------------------ the study process


def hold(moment: str) -> None:
    """Hold this process at `moment` of its life if a test asked to (autotune/testing/moments.py names them)."""
    if os.environ.get(HOLD_VARIABLE):
        _testing("moments").reach(moment)


def hold_once_connected(moment: str) -> None:
    """Hold at `moment` once the next connection to a database is made, if a test asked to."""
    if os.environ.get(HOLD_VARIABLE):
        _testing("moments").reach_once_connected(moment)


FINALISTS = "evaluation"  # the key of a fault in every finalist's evaluation on the task (not the reference's)


def fault_for(launch_index: int | str, config: Mapping[str, Any]) -> Fault | None:
    """The fault a test asked this trial to fail with (its task spec's `fault`), or None; `launch_index`: the trial's
    launch in this process (from 0), or FINALISTS for a finalist's evaluation."""
    if not os.environ.get(FAULTS_VARIABLE):
        return None
    return _testing("faults").injected_fault(launch_index, config)


# ------------------------------------------------------------------------------ the trial worker (a task's fault)


def garbled_result(fault: Fault | None, result_path: Path) -> bool:
    """Whether the fault wrote a result no reader can parse in place of the task's (then the task does not run)."""
    return bool(fault) and _testing("worker_faults").garbled_result(fault, result_path)


def phase_starting(fault: Fault | None, phase: str) -> None:
    """Fail for real as the fault asks, if it names this phase."""
    if fault:
        _testing("worker_faults").at_phase(fault, phase)


def model_loaded(fault: Fault | None, model: Any) -> None:
    """Plant the fault in the loaded model, if it is one that lives there."""
    if fault:
        _testing("worker_faults").plant(fault, model)


def batch_measuring(fault: Fault | None, size: int) -> None:
    """Fail for real as the fault asks, if it names a batch this size or smaller (a capacity probe's)."""
    if fault:
        _testing("worker_faults").at_batch(fault, size)


def load_starting(fault: Fault | None, server: Any) -> None:
    """Kill the serve trial's server as its load starts, if the fault asks."""
    if fault:
        _testing("worker_faults").at_load(fault, server)
