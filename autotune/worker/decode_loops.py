"""Decoding loops for transformers' `generate(custom_generate=...)`: greedy search and sampling as generate()'s own
loop does them (`GenerationMixin._sample`), the same tokens, with less between two decoding steps.

generate() prepares everything (the inputs, the cache, the logits processors and stopping criteria) and then calls
the loop in place of its own. Two loops:

- `deferred_stop`: generate()'s own bookkeeping at each step, but the host does not read the device to learn
  whether every row has stopped: the count of steps after which every row had stopped is kept on the device and
  read every `STOP_CHECK_INTERVAL` steps, from a copy made at the check before (so the read never waits for the
  steps just queued); the steps run past the stop are undone. generate()'s loop reads it after every token, so the
  host never runs ahead of the device.
- `fused_step`: one call per token into a decoding step that runs the model's forward, the choice of the token (the
  argmax, or the logits handed to the logits processors and sampling when there are any), the end-of-sequence
  bookkeeping and the next positions; compiled as a whole where generate() would compile the forward (its
  compile_config), and kept on the model, so it is compiled once per model and configuration. The mask and the
  positions are prepared once per call and advanced in place; a static cache is kept on the model across calls
  (reset, not rebuilt), so a compiled step and its CUDA graphs see the same buffers each call. The stop is read as
  in `deferred_stop`.

What both loops do as generate()'s loop does it, and the late stop, are autotune/worker/decode_steps.py; the fused
step is autotune/worker/fused_step.py. The three modules import only torch, transformers and each other (relatively):
they are copied as they are into the folder a deployment keeps beside its code (`custom_generate/`, written by
`autotune loop`, autotune/report/loop_folder.py). Both loops refuse, in one
ValueError, what they do not do (beam search, assisted decoding, encoder-decoder models, attentions or hidden states
in the output, chunked prefill). generate() hands a callable no streamer, synced_gpus or assistant model (it keeps
them for its own loops): the folder's entry refuses those before generate() drops them. In a trial, the module is the
decode_loop knob's worker hook (`generate_arguments`, autotune/worker/hooks.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

# Relative: the folder `autotune loop` writes holds these modules side by side, as the package does.
from .decode_steps import Loop
from .fused_step import FusedLoop


def deferred_stop(
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    **model_kwargs: Any,
) -> Any:
    """generate()'s decoding loop with the stop read late: a `custom_generate` callable."""
    loop = Loop("deferred-stop", model, input_ids, logits_processor, stopping_criteria, generation_config)
    loop.refuse_unsupported(model_kwargs)
    with _decoding(model):
        return loop.run_stock_steps(model_kwargs)


def fused_step(
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    **model_kwargs: Any,
) -> Any:
    """One (compiled) call per token, inputs prepared once, the stop read late: a `custom_generate` callable."""
    loop = FusedLoop("fused-step", model, input_ids, logits_processor, stopping_criteria, generation_config)
    loop.refuse_unsupported(model_kwargs)
    extra = set(model_kwargs) - FUSED_INPUTS
    if extra:
        raise ValueError(f"decode loop fused-step takes text models' inputs only, not {', '.join(sorted(extra))}")
    with _decoding(model):
        return loop.run(model_kwargs)


LOOPS: dict[str, Callable[..., Any]] = {"deferred-stop": deferred_stop, "fused-step": fused_step}


def generate_arguments(knob: str, loop: str) -> dict[str, Any]:
    """The worker hook of decode_loop (autotune/worker/hooks.py): every generate() of the trial runs `loop`."""
    return {"custom_generate": LOOPS[loop]}


# What generate() hands a decoder-only text model's loop; anything else (images, token types) needs generate()'s own
# per-step preparation.
FUSED_INPUTS = frozenset({"past_key_values", "attention_mask", "position_ids", "use_cache", "logits_to_keep"})


@contextlib.contextmanager
def _decoding(model: Any) -> Any:
    """What generate()'s loop runs inside (a mixture of experts' decoding kernels), where this transformers has it."""
    optimize = getattr(model, "_optimize_model_for_decode", None)
    with optimize() if optimize is not None else contextlib.nullcontext():
        yield
