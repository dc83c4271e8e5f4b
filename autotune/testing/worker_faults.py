"""What the trial worker does to fail for real, as a task spec's `fault` asks (autotune/for_tests.py calls these):

- as a phase starts (`{"phase": "load", "kind": ...}`): hang, stall (then go on), raise, exit without a result, die
  by a signal, run out of memory (inject);
- planted in the loaded model (`kind` of MODEL_FAULTS): slower for real, wrong on the decoding path only, or running
  away (plant);
- at a capacity probe's batch (`"batch": N`: from this batch on) or as a serve trial's load starts (`kill_server`);
- in place of the task's result (`garbage`).

It imports torch: only the trial worker reaches it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from autotune.for_tests import Fault

STALL_S = 30.0
MODEL_FAULTS = ("slow_forward", "decode_drift", "runaway")  # planted in the loaded model, not as a phase starts
DRIFT_SCALE = 4.0  # decode_drift: the logits' shift, in standard deviations of a normal draw per token
RUNAWAY_SPANS = range(2, 7)  # runaway: the lengths of a span whose immediate repeat starts the loop


def garbled_result(fault: Fault, result_path: Path) -> bool:
    if fault.kind != "garbage":
        return False
    result_path.write_text("{this is not a result")
    return True


def at_phase(fault: Fault, phase: str) -> None:
    """Inject the fault as this phase starts, unless a probe injects it at a batch (at_batch) or the model carries it
    (plant)."""
    if fault.phase == phase and fault.batch is None and fault.kind not in MODEL_FAULTS:
        inject(fault.kind, fault.until)


def at_batch(fault: Fault, size: int) -> None:
    """A probe that fails from this batch on."""
    if fault.batch is not None and size >= fault.batch:
        inject(fault.kind)


def at_load(fault: Fault, server: Any) -> None:
    """The server dies as the load starts, whatever its speed."""
    if fault.kind == "kill_server":
        server.kill()


def plant(fault: Fault, model: Any) -> None:
    """A model slower for real, whatever else runs beside it (slow_forward: a sleep per forward pass), or wrong on the
    decoding path only (decode_drift: every forward pass of one new token per row, as a KV cache decodes, has a fixed
    random shift added to its logits; a pass over a whole text, the prefill path, is left exact), or a generation that
    runs away (runaway: once a row's decoded tokens end in a span of RUNAWAY_SPANS tokens said twice in a row, the span
    is made the next tokens' first choice, so the row loops to the end; text forced along, which seldom repeats itself
    so, is left nearly exact)."""
    kind = fault.kind
    if kind == "slow_forward":
        assert fault.seconds is not None, "a slow_forward fault says how long each forward pass sleeps"
        delay = fault.seconds
        model.register_forward_hook(lambda *_: time.sleep(delay))
    elif kind == "decode_drift":
        generator = torch.Generator().manual_seed(0)
        shift = DRIFT_SCALE * torch.randn(model.config.get_text_config(decoder=True).vocab_size, generator=generator)

        def drift(module: Any, args: tuple, kwargs: dict, output: Any) -> Any:
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None and ids.shape[1] == 1:
                output.logits = output.logits + shift.to(output.logits.device, output.logits.dtype)
            return output

        model.register_forward_hook(drift, with_kwargs=True)
    elif kind == "runaway":
        model.register_forward_hook(_runaway_hook(), with_kwargs=True)


def _runaway_hook() -> Callable[..., Any]:
    """A forward hook that remembers each row's decoded tokens since the last prefill and, once they end in a span
    said twice, puts the token that continues the cycle first."""
    decoded: list[list[int]] = []

    def runaway(module: Any, args: tuple, kwargs: dict, output: Any) -> Any:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            return output
        if ids.shape[1] != 1:  # a prefill: a new generation starts
            decoded[:] = [[] for _ in range(ids.shape[0])]
            return output
        if len(decoded) != ids.shape[0]:
            return output
        logits = output.logits.clone()
        for row, token in enumerate(ids[:, 0].tolist()):
            history = decoded[row]
            history.append(token)
            period = next((p for p in RUNAWAY_SPANS if _said_twice(history, p)), 0)
            if period:
                logits[row, -1, history[-period]] = logits[row, -1].max() + 10.0
        output.logits = logits
        return output

    return runaway


def _said_twice(history: list[int], span: int) -> bool:
    return len(history) >= 2 * span and history[-2 * span : -span] == history[-span:]


def inject(kind: str, until: str | None = None) -> None:
    """Fail for real: hang, stall (then go on), raise, exit without a result, die by a signal, run out of memory. A
    stall ends after STALL_S, or as soon as the file `until` exists (the test is done)."""
    if kind == "stall":  # a trial slow enough for a test to act while it runs
        deadline = time.monotonic() + STALL_S
        while time.monotonic() < deadline and not (until and Path(until).exists()):
            time.sleep(0.1)
    elif kind == "hang":
        time.sleep(10**6)
    elif kind == "hang_with_child":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10**6)", "autotune-fault-child"])
        time.sleep(10**6)
    elif kind == "raise":
        raise RuntimeError("injected failure")
    elif kind == "exit":
        os._exit(3)
    elif kind == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "oom":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.empty(1 << 62, dtype=torch.uint8, device=device)
    else:
        raise ValueError(f"unknown fault kind {kind!r}")
