"""Turn an exception raised inside a trial into an outcome with a reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from autotune.process.results import Outcome
from autotune.space.knobs import KNOBS

_OOM_MARKERS = (
    "out of memory",
    "can't allocate memory",
    "not enough memory",
    "cublas_status_alloc_failed",
    "cuda error: out of memory",
)
_UNSUPPORTED_MARKERS = (
    "not supported",
    "does not support",
    "is not a valid attention implementation",
    "not compiled with cuda",
    "requires a gpu",
    "requires cuda",
    "only supported",
    "cannot be used",
    # a forced sdpa kernel (sdpa_backend) that cannot run these inputs on this device
    "no available kernel",
    "no viable backend",
    # a kernel or checkpoint that would have to be downloaded, on a machine that cannot
    "offline",
    "couldn't connect",
    "failed to resolve",
    "localentrynotfound",
    "not in the local cache",
)


class BrokenOutputError(RuntimeError):
    """The configuration ran, but its output is unusable (NaN/inf logits, empty or degenerate text)."""


class UnsupportedError(RuntimeError):
    """This installation cannot run the configuration; the message says what to install or change.

    `combination=True`: the values work apart and fail together, so no single knob value is to blame.
    """

    def __init__(self, message: str, *, combination: bool = False) -> None:
        super().__init__(message)
        self.combination = combination


@dataclass(frozen=True)
class Classified:
    outcome: Outcome
    message: str
    knob: str | None = None  # the knob to blame, when the failure can never go away in this environment


def classify(error: BaseException, config: dict[str, Any] | None = None) -> Classified:
    """The outcome of a failed task; an unsupported one blames the knob of `config` it names, if any."""
    message = f"{type(error).__name__}: {error}".strip()
    lowered = message.lower()
    if isinstance(error, BrokenOutputError):
        return Classified(Outcome.BROKEN, str(error))
    if isinstance(error, torch.OutOfMemoryError | MemoryError) or any(m in lowered for m in _OOM_MARKERS):
        return Classified(Outcome.OOM, message)
    unsupported = isinstance(error, ImportError | NotImplementedError | UnsupportedError)
    if isinstance(error, UnsupportedError) and error.combination:
        return Classified(Outcome.UNSUPPORTED, message)
    if unsupported or any(m in lowered for m in _UNSUPPORTED_MARKERS):
        return Classified(Outcome.UNSUPPORTED, message, _blamed_knob(lowered, config or {}))
    return Classified(Outcome.ERROR, message)


def _blamed_knob(lowered: str, config: dict[str, Any]) -> str | None:
    """The knob that refuses whatever its value, else the knob whose value the message names, else the first
    (in registry order) whose words it uses, among the knobs set."""
    for name, knob in KNOBS.items():
        if name in config and any(phrase in lowered for phrase in knob.refusals):
            return name  # e.g. even sdpa: this architecture refuses it at load time
    for name, value in config.items():
        if isinstance(value, str) and len(value) > 4 and value.lower() in lowered and value not in _COMMON_VALUES:
            return name
    for name, knob in KNOBS.items():
        words = knob.failure_words
        if name in config and config[name] not in _COMMON_VALUES and any(word in lowered for word in words):
            return name
    return None


# Defaults and dtypes: a message that names one of these does not blame the knob that has it.
_COMMON_VALUES = {
    "none",
    "off",
    "auto",
    "generate",
    "dynamic",
    "sdpa",
    "float32",
    "float16",
    "bfloat16",
    "throughput",
    "latency",
}
