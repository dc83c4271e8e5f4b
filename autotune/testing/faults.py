"""Faults injected into real trials by the tests (AUTOTUNE_INJECT_FAULTS): which trial of a search fails, where and how;
the worker fails as told (TaskSpec.fault, autotune/testing/worker_faults.py)."""

from __future__ import annotations

import json
import os

from autotune.for_tests import FAULTS_VARIABLE, Fault
from autotune.space import Config


def injected_fault(launch_index: int | str, config: Config) -> Fault | None:
    """Tests make a trial fail for real: the n-th trial this process launches (from 0), every finalist's evaluation on
    the task (for_tests.FINALISTS), or every trial of the configurations that have all the knob values a key names,
    whichever trial launches them.

    AUTOTUNE_INJECT_FAULTS='{"3": {"phase": "load", "kind": "hang"}}' makes the fourth trial hang while loading;
    '{"dtype=float32,attn_implementation=eager": {"phase": "load", "kind": "raise"}}' makes every float32 eager
    trial raise while loading; '{"evaluation": {"phase": "evaluate", "kind": "stall"}}' stalls each finalist's
    evaluation.
    """
    faults = os.environ.get(FAULTS_VARIABLE)
    if not faults:
        return None
    for key, fault in json.loads(faults).items():
        if key == str(launch_index) or ("=" in key and _has_values(config, key)):
            return Fault.from_json(fault)
    return None


def _has_values(config: Config, pairs: str) -> bool:
    """Whether `config` has every value of "knob=value,knob=value"."""
    return all(str(config.get(knob)) == value for knob, _, value in (pair.partition("=") for pair in pairs.split(",")))
