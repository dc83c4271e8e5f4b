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

This module imports only torch and transformers: it is copied as it is into the folder a deployment keeps beside its
code (`custom_generate/`, written by `autotune loop`, autotune/report/loop_folder.py). Both loops refuse, in one
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
from transformers import StaticCache
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

STOP_CHECK_INTERVAL = 4  # steps between two reads of the stop count; each reads the copy made at the check before
KEPT_CACHE = "_decode_loop_static_cache"  # the model attribute a fused step's static cache is kept in
KEPT_STEPS = "_decode_loop_compiled_steps"  # the model attribute its compiled steps are kept in, per configuration


# ------------------------------------------------------------------------------------------------- the loops


def deferred_stop(
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    **model_kwargs: Any,
) -> Any:
    """generate()'s decoding loop with the stop read late: a `custom_generate` callable."""
    loop = _Loop("deferred-stop", model, input_ids, logits_processor, stopping_criteria, generation_config)
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
    loop = _FusedLoop("fused-step", model, input_ids, logits_processor, stopping_criteria, generation_config)
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


class _Loop:
    """What both loops share: the prompt, the token choice, the stopping criteria, the late stop, the output."""

    def __init__(
        self, name: str, model: Any, input_ids: torch.Tensor, processors: Any, criteria: Any, config: Any
    ) -> None:
        self.name = name
        self.model = model
        self.prompt_len = input_ids.shape[1]
        self.input_ids = input_ids
        self.processors = processors
        self.config = config
        self.max_steps = criteria.max_length - self.prompt_len  # the length is counted here, on the host
        self.criteria = [criterion for criterion in criteria if not isinstance(criterion, MaxLengthCriteria)]
        # generate() pads the rows that have stopped when an end-of-sequence criterion is given, as _sample does
        self.pads_stopped_rows = any(hasattr(criterion, "eos_token_id") for criterion in criteria)
        pad = getattr(config, "_pad_token_tensor", None)
        self.pad = pad.to(input_ids.device) if pad is not None and self.pads_stopped_rows else None
        rows = input_ids.shape[0]
        self.unfinished = torch.ones(rows, dtype=torch.long, device=input_ids.device)
        self.done = torch.zeros((), dtype=torch.long, device=input_ids.device)  # steps after which every row stopped
        self.stop = _LateStop(input_ids.device)
        self.scores: list[torch.Tensor] = []  # the processed scores, when asked for
        self.logits: list[torch.Tensor] = []  # the raw logits, when asked for

    def refuse_unsupported(self, model_kwargs: dict[str, Any]) -> None:
        """ValueError for what this loop does not do; generate()'s own arguments for other modes dropped."""
        config = self.config
        refused = {
            "an encoder-decoder model": self.model.config.is_encoder_decoder,
            "beam search": getattr(config, "num_beams", 1) > 1,
            "assisted decoding": model_kwargs.get("assistant_model") is not None
            or getattr(config, "prompt_lookup_num_tokens", None) is not None
            or getattr(config, "assistant_early_exit", None) is not None,
            "attentions or hidden states in the output": bool(
                config.return_dict_in_generate and (config.output_attentions or config.output_hidden_states)
            ),
            "chunked prefill": getattr(config, "prefill_chunk_size", None) is not None,
            "inputs_embeds": model_kwargs.get("inputs_embeds") is not None,
        }
        what = [name for name, is_asked in refused.items() if is_asked]
        if what:
            raise ValueError(f"decode loop {self.name} does not do {what[0]}: call generate() without custom_generate")
        for key in ("assistant_model", "tokenizer", "assistant_tokenizer"):
            model_kwargs.pop(key, None)

    def choose(self, sequence: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The next token of each row from the last position's logits, as _sample chooses it, the rows that have
        stopped padded: [rows]."""
        next_logits = logits.to(copy=True, dtype=torch.float32, device=sequence.device)
        scores = self.processors(sequence, next_logits)
        if self.config.return_dict_in_generate:
            if self.config.output_scores:
                self.scores.append(scores)
            if self.config.output_logits:
                self.logits.append(next_logits)
        if self.config.do_sample:
            probs = torch.nn.functional.softmax(scores, dim=-1)
            tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
        else:
            tokens = torch.argmax(scores, dim=-1)
        if self.pad is not None:
            tokens = tokens * self.unfinished + self.pad * (1 - self.unfinished)
        return tokens

    def apply_criteria(self, criteria: list[Any], sequence: torch.Tensor) -> None:
        """These stopping criteria on the sequence so far (ending at the new token)."""
        scores = tuple(self.scores) if self.config.output_scores else None
        for criterion in criteria:
            self.unfinished = self.unfinished & ~criterion(sequence, scores)

    def count_done(self) -> None:
        self.done = self.done + (self.unfinished.max() == 0)

    def run_stock_steps(self, model_kwargs: dict[str, Any]) -> Any:
        """generate()'s steps: its inputs prepared and its model kwargs updated at each step, the stop read late."""
        model, sequence = self.model, self.input_ids
        compiles = _compiles(model, model_kwargs, self.config)
        forward = model.get_compiled_call(self.config.compile_config) if compiles else model.__call__
        outputs = _prefill(model, sequence, model_kwargs)
        step = 0
        while True:
            model_kwargs = model._update_model_kwargs_for_generation(outputs, model_kwargs)
            sequence = torch.cat([sequence, self.choose(sequence, outputs.logits[:, -1])[:, None]], dim=-1)
            del outputs
            self.apply_criteria(self.criteria, sequence)
            self.count_done()
            step += 1
            stopped_at = self.stop.after(step, self.done, counted_through=step, last=step == self.max_steps)
            if stopped_at is not None:
                break
            inputs = model.prepare_inputs_for_generation(sequence, next_sequence_length=1, **model_kwargs)
            outputs = forward(**inputs, return_dict=True)
        returned = model_kwargs.get("past_key_values") if self.config.return_dict_in_generate else None
        return self.finish(sequence, stopped_at, returned)

    def finish(self, sequence: torch.Tensor, stopped_at: int, returned_cache: Any) -> Any:
        """The output as generate() returns it, without the steps run past the stop."""
        undone = sequence.shape[1] - self.prompt_len - stopped_at
        if undone:
            sequence = sequence[:, : self.prompt_len + stopped_at]
            del self.scores[stopped_at:], self.logits[stopped_at:]
            if returned_cache is not None and returned_cache.is_croppable:
                returned_cache.crop(-undone)
        if not self.config.return_dict_in_generate:
            return sequence
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        scores = tuple(self.scores) if self.config.output_scores else None
        logits = tuple(self.logits) if self.config.output_logits else None
        return GenerateDecoderOnlyOutput(
            sequences=sequence, scores=scores, logits=logits, past_key_values=returned_cache
        )


class _FusedLoop(_Loop):
    """One call per token into a step that chooses the token and keeps the end-of-sequence bookkeeping itself, where
    nothing but greedy search is asked for; otherwise the step returns the logits for the processors and sampling."""

    def run(self, model_kwargs: dict[str, Any]) -> Any:
        self.cache = _kept_cache(self.model, model_kwargs, self.input_ids.shape[0])
        config = self.config
        keeps_scores = config.return_dict_in_generate and (config.output_scores or config.output_logits)
        self.greedy = not config.do_sample and len(self.processors) == 0 and not keeps_scores
        self.step = self._step(model_kwargs, _choosing_step if self.greedy else _logits_step)
        self.inputs = _StepInputs(model_kwargs, self.prompt_len, self.max_steps, self.cache)
        self._first_token(model_kwargs)
        in_step = [c for c in self.criteria if isinstance(c, EosTokenCriteria)] if self.greedy else []
        self.eager = [c for c in self.criteria if c not in in_step]
        self.eos = torch.cat([c.eos_token_id.to(self.input_ids.device).flatten() for c in in_step]) if in_step else None
        while (stopped_at := self._stopped()) is None:
            if self.greedy:
                self._greedy_step()
            else:
                self._logits_step()
        returned = model_kwargs.get("past_key_values") if config.return_dict_in_generate else None
        sequence = self.sequence[:, : self.length]
        return self.finish(sequence, stopped_at, returned if returned is not self.cache else None)

    def _first_token(self, model_kwargs: dict[str, Any]) -> None:
        """The prefill, and the sequence buffer with the prompt and the first token, its criteria applied."""
        outputs = _prefill(self.model, self.input_ids, model_kwargs)
        self.tokens = self.choose(self.input_ids, outputs.logits[:, -1])
        del outputs
        rows, self.length = self.input_ids.shape[0], self.prompt_len + 1
        self.sequence = torch.empty(
            rows, self.prompt_len + self.max_steps, dtype=torch.long, device=self.input_ids.device
        )
        self.sequence[:, : self.prompt_len] = self.input_ids
        self.sequence[:, self.prompt_len] = self.tokens
        self.apply_criteria(self.criteria, self.sequence[:, : self.length])
        self.copy_out = self.input_ids.device.type == "cuda"  # CUDA graphs overwrite a step's outputs at the next step

    def _stopped(self) -> int | None:
        """After each token: the steps to keep once generation has stopped (read late), else None."""
        steps = self.length - self.prompt_len
        last = steps == self.max_steps
        counted = self.greedy and not last  # a greedy step counts the step before it; otherwise it is counted here
        if not counted:
            self.count_done()
        return self.stop.after(steps, self.done, steps - counted, last)

    def _greedy_step(self) -> None:
        if self.copy_out:
            torch.compiler.cudagraph_mark_step_begin()
        positions, mask = self.inputs.advance()
        unfinished, done = self.unfinished, self.done
        out = self.step(
            self.model, self.tokens[:, None], positions, mask, self.cache, unfinished, done, self.pad, self.eos
        )
        self.tokens, self.unfinished, self.done = (tensor.clone() for tensor in out) if self.copy_out else out
        self._append()

    def _logits_step(self) -> None:
        if self.copy_out:
            torch.compiler.cudagraph_mark_step_begin()
        positions, mask = self.inputs.advance()
        logits = self.step(self.model, self.tokens[:, None], positions, mask, self.cache)
        self.tokens = self.choose(self.sequence[:, : self.length], logits.clone() if self.copy_out else logits)
        self._append()

    def _append(self) -> None:
        self.sequence[:, self.length] = self.tokens
        self.length += 1
        if self.eager:
            self.apply_criteria(self.eager, self.sequence[:, : self.length])

    def _step(self, model_kwargs: dict[str, Any], step: Callable[..., Any]) -> Callable[..., Any]:
        """The decoding step, compiled where generate() would compile the forward, with its compile_config; kept on the
        model, so it is compiled once per model and configuration."""
        if not _compiles(self.model, model_kwargs, self.config):
            return step
        compile_config = self.config.compile_config or self.model._default_compile_config()
        options = compile_config.to_dict()
        key = (step.__name__, repr(sorted(options.items())))
        compiled = self.model.__dict__.setdefault(KEPT_STEPS, {})
        if key not in compiled:
            compiled[key] = torch.compile(step, **options)
        return compiled[key]


# ------------------------------------------------------------------------------------------------ the parts


def _prefill(model: Any, input_ids: torch.Tensor, model_kwargs: dict[str, Any]) -> Any:
    """The prompt's forward, uncompiled, as generate()'s prefill runs it."""
    inputs = model.prepare_inputs_for_generation(input_ids, is_first_iteration=True, **model_kwargs)
    return model(**inputs, return_dict=True)


def _compiles(model: Any, model_kwargs: dict[str, Any], config: Any) -> bool:
    """Whether generate() would compile the forward for this call (its compile_config, cache and quantization)."""
    return bool(model._valid_auto_compile_criteria(model_kwargs, config))


def _kept_cache(model: Any, model_kwargs: dict[str, Any], rows: int) -> Any:
    """The static cache generate() made for this call, or the one kept on the model from an earlier call of the same
    shape (reset), which then replaces it; a cache the caller passed in is used as it is. One cache is kept at most."""
    cache = model_kwargs.get("past_key_values")
    if type(cache) is not StaticCache or getattr(cache, "_is_user_defined", False):
        return cache
    kept = getattr(model, KEPT_CACHE, None)
    if kept is not None and _same_shape(kept, cache, rows):
        kept.reset()
        model_kwargs["past_key_values"] = kept
        return kept
    setattr(model, KEPT_CACHE, cache)
    return cache


def _same_shape(kept: Any, fresh: Any, rows: int) -> bool:
    """Whether a kept cache can serve as this call's fresh one: as long, as many layers, as many rows."""
    same_length = kept.get_max_length() == fresh.get_max_length() and len(kept.layers) == len(fresh.layers)
    return same_length and kept.batch_size == rows


class _StepInputs:
    """A step's positions and mask, prepared once per call and advanced in place.

    A static cache is given its whole length of mask (ones past the prompt: the causal mask hides what is not written
    yet), so a compiled step sees one shape each time; another cache the mask so far, as generate() gives it."""

    def __init__(self, model_kwargs: dict[str, Any], prompt_len: int, max_steps: int, cache: Any) -> None:
        positions = model_kwargs.get("position_ids")
        if positions is None:
            raise ValueError("decode loop fused-step needs the position ids generate() prepares for the model")
        self.positions = positions[..., -1:].clone()  # [rows or 1, 1]: the last position, moved on before each step
        self.length = prompt_len
        self.whole = isinstance(cache, StaticCache)
        self.mask: torch.Tensor | None = None
        mask = model_kwargs.get("attention_mask")  # None where generate() dropped it: no padding
        if mask is not None:
            width = cache.get_max_length() if self.whole else prompt_len + max_steps
            self.mask = torch.ones(mask.shape[0], width, dtype=mask.dtype, device=mask.device)
            self.mask[:, :prompt_len] = mask

    def advance(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The next step's positions and mask."""
        self.positions.add_(1)
        self.length += 1
        if self.mask is None or self.whole:
            return self.positions, self.mask
        return self.positions, self.mask[:, : self.length]


def _choosing_step(
    model: Any, tokens: torch.Tensor, positions: torch.Tensor, mask: Any, cache: Any, unfinished: torch.Tensor,
    done: torch.Tensor, pad: torch.Tensor | None, eos: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """One greedy step: [rows, 1] tokens in; out the next tokens [rows] (rows that had stopped padded), the rows
    unfinished after them, and the count of steps after which every row had stopped, the step before this one
    included."""
    logits = _logits_step(model, tokens, positions, mask, cache)
    next_tokens = torch.argmax(logits.to(dtype=torch.float32), dim=-1)
    done = done + (unfinished.max() == 0)
    if pad is not None:
        next_tokens = next_tokens * unfinished + pad * (1 - unfinished)
    if eos is not None:
        unfinished = unfinished & ~torch.isin(next_tokens, eos)
    return next_tokens, unfinished, done


def _logits_step(model: Any, tokens: torch.Tensor, positions: torch.Tensor, mask: Any, cache: Any) -> torch.Tensor:
    """One step's logits at its one position: [rows, vocabulary]."""
    out = model(
        input_ids=tokens, position_ids=positions, attention_mask=mask, past_key_values=cache, use_cache=True,
        logits_to_keep=1, return_dict=True,
    )  # fmt: skip
    return out.logits[:, -1]


class _LateStop:
    """The step after which every row had stopped, read from the device every STOP_CHECK_INTERVAL steps, each time
    from the copy made at the check before: the host never waits for the steps it has just queued."""

    def __init__(self, device: torch.device) -> None:
        self.pending: tuple[int, torch.Tensor, Any] | None = None  # (steps counted, count copied, copy event)
        self.pinned = device.type == "cuda"

    def after(self, step: int, done: torch.Tensor, counted_through: int, last: bool) -> int | None:
        """After `step` steps, with `done` counting the steps up to `counted_through` after which every row had
        stopped: the number of steps to keep once generation has stopped, else None."""
        if last:
            count = int(done.item())
            return counted_through - count + 1 if count else step
        if step % STOP_CHECK_INTERVAL:
            return None
        read = self._read_pending()
        self._copy(counted_through, done)
        return read

    def _copy(self, counted_through: int, done: torch.Tensor) -> None:
        copy = torch.empty((), dtype=done.dtype, pin_memory=self.pinned)
        copy.copy_(done, non_blocking=self.pinned)
        event = None
        if self.pinned:
            event = torch.cuda.Event()
            event.record()
        self.pending = (counted_through, copy, event)

    def _read_pending(self) -> int | None:
        if self.pending is None:
            return None
        counted_through, copy, event = self.pending
        if event is not None:
            event.synchronize()
        count = int(copy.item())
        return counted_through - count + 1 if count else None
