"""decode_loop=fused-step's step (autotune/worker/decode_loops.py): one call per token into a step that runs the
model's forward, chooses the token and keeps the end-of-sequence bookkeeping where nothing but greedy search is asked
for (else it returns the logits for the processors and sampling); compiled as a whole where generate() would compile
the forward, and kept on the model; its positions and mask prepared once per call and advanced in place; a static
cache kept on the model across calls.

Copied beside the loops into the folder a deployment keeps (autotune/report/loop_folder.py): torch and transformers
only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import StaticCache
from transformers.generation.stopping_criteria import EosTokenCriteria

from .decode_steps import Loop, compiles_forward, prefill

KEPT_CACHE = "_decode_loop_static_cache"  # the model attribute a fused step's static cache is kept in
KEPT_STEPS = "_decode_loop_compiled_steps"  # the model attribute its compiled steps are kept in, per configuration


class FusedLoop(Loop):
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
        outputs = prefill(self.model, self.input_ids, model_kwargs)
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
        if not compiles_forward(self.model, model_kwargs, self.config):
            return step
        compile_config = self.config.compile_config or self.model._default_compile_config()
        options = compile_config.to_dict()
        key = (step.__name__, repr(sorted(options.items())))
        compiled = self.model.__dict__.setdefault(KEPT_STEPS, {})
        if key not in compiled:
            compiled[key] = torch.compile(step, **options)
        return compiled[key]


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
