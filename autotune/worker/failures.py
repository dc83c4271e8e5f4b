"""Turn an exception raised inside a trial into an outcome with a reason, and the knob value it blames.

A value is blamed for certain only on a typed refusal: the worker's own check naming the knob (UnsupportedError),
a sentence its handler lists as transformers' refusal of that knob (`refusals`), or an exception of a refusal
type (ImportError: a missing package; NotImplementedError; UnsupportedError). Any other exception whose words
say "not supported" and point at a knob (`failure_words`, or its value named) only makes its value suspected:
the study tries it once more in another configuration before it excludes it.
"""

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

    `knob`: the knob whose value the worker's own check refused (it is excluded for the study).
    `combination=True`: the values work apart and fail together, so no single knob value is to blame.
    """

    def __init__(self, message: str, *, knob: str | None = None, combination: bool = False) -> None:
        super().__init__(message)
        self.knob = knob
        self.combination = combination


# How transformers (ImportError: a missing package; NotImplementedError) and the worker's own checks refuse.
_REFUSAL_TYPES = (ImportError, NotImplementedError, UnsupportedError)


@dataclass(frozen=True)
class Classified:
    outcome: Outcome
    message: str
    knob: str | None = None  # the knob blamed, when the failure would never go away in this environment
    certain: bool = False  # a typed refusal blames it; else only words of the message point at it (suspected)


def classify(error: BaseException, config: dict[str, Any] | None = None) -> Classified:
    """The outcome of a failed task; an unsupported one blames the knob of `config` it names, if any."""
    message = f"{type(error).__name__}: {error}".strip()
    lowered = message.lower()
    config = config or {}
    if isinstance(error, BrokenOutputError):
        return Classified(Outcome.BROKEN, str(error))
    if isinstance(error, torch.OutOfMemoryError | MemoryError) or any(m in lowered for m in _OOM_MARKERS):
        return Classified(Outcome.OOM, message)
    if isinstance(error, UnsupportedError):
        if error.combination:
            return Classified(Outcome.UNSUPPORTED, message)
        if error.knob in config:
            return Classified(Outcome.UNSUPPORTED, message, error.knob, certain=True)
    typed = isinstance(error, _REFUSAL_TYPES)
    if not typed and not any(m in lowered for m in _UNSUPPORTED_MARKERS):
        return Classified(Outcome.ERROR, message)
    refusing = _refusing_knob(lowered, config)
    if refusing is not None:
        return Classified(Outcome.UNSUPPORTED, message, refusing, certain=True)
    knob = _named_knob(lowered, config) or _knob_of_words(lowered, config)
    return Classified(Outcome.UNSUPPORTED, message, knob, certain=typed and knob is not None)


def _refusing_knob(lowered: str, config: dict[str, Any]) -> str | None:
    """The knob whose refusal sentence the message says, whatever its value (e.g. an architecture refusing sdpa)."""
    for name, knob in KNOBS.items():
        if name in config and any(phrase in lowered for phrase in knob.refusals):
            return name
    return None


def _named_knob(lowered: str, config: dict[str, Any]) -> str | None:
    """The knob whose value the message names."""
    for name, value in config.items():
        if isinstance(value, str) and len(value) > 4 and value.lower() in lowered and not _usual(name, value):
            return name
    return None


def _knob_of_words(lowered: str, config: dict[str, Any]) -> str | None:
    """The first knob set (in registry order), to an unusual value, whose words the message uses."""
    for name, knob in KNOBS.items():
        if name in config and not _usual(name, config[name]) and any(word in lowered for word in knob.failure_words):
            return name
    return None


def _usual(name: str, value: Any) -> bool:
    """A value a message may name without being about its knob (its default, a dtype, the workload)."""
    return name in KNOBS and str(value) in map(str, KNOBS[name].usual_values())
