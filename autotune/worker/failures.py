"""Turn an exception raised inside a trial into an outcome with a reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from autotune.results import Outcome

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
    # a kernel or checkpoint that would have to be downloaded, on a machine that cannot
    "offline",
    "couldn't connect",
    "failed to resolve",
    "localentrynotfound",
    "not in the local cache",
)
# What from_pretrained says when an architecture refuses an attention backend (sdpa, flex, flash).
_REFUSED_ATTENTION = "does not support an attention implementation"
# Which knob a missing package or refusal points to, by words in the message.
_KNOB_HINTS = (
    ("attn_implementation", ("flash", "attention", "attn", "kernels")),
    ("quantization", ("bitsandbytes", "bnb", "quantiz")),
    ("cache_implementation", ("cache", "quanto", "hqq", "offload")),
    ("compile", ("compile", "inductor", "dynamo", "triton")),
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
    """The knob whose value the message names, else the first whose words it uses, among the knobs set."""
    if _REFUSED_ATTENTION in lowered and "attn_implementation" in config:
        return "attn_implementation"  # even sdpa: this architecture refuses it at load time
    for knob, value in config.items():
        if isinstance(value, str) and len(value) > 4 and value.lower() in lowered and value not in _COMMON_VALUES:
            return knob
    for knob, words in _KNOB_HINTS:
        if knob in config and config[knob] not in _COMMON_VALUES and any(word in lowered for word in words):
            return knob
    return None


# Defaults and dtypes: a message that names one of these does not blame the knob that has it.
_COMMON_VALUES = {
    "none",
    "off",
    "generate",
    "dynamic",
    "sdpa",
    "float32",
    "float16",
    "bfloat16",
    "throughput",
    "latency",
}
