"""What both decoding loops of autotune's (autotune/worker/decode_loops.py) do as generate()'s own loop does it: the
prompt's forward, the token chosen (greedy or sampled, after the logits processors), the stopping criteria, the rows
that stopped padded, generate()'s own steps, and the output without the steps run past the stop; and the late stop,
the count of steps after which every row had stopped, read from the device every STOP_CHECK_INTERVAL steps.

Copied beside the loops into the folder a deployment keeps (autotune/report/loop_folder.py): torch and transformers
only.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.generation.stopping_criteria import MaxLengthCriteria

STOP_CHECK_INTERVAL = 4  # steps between two reads of the stop count; each reads the copy made at the check before


class Loop:
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
        compiles = compiles_forward(model, model_kwargs, self.config)
        forward = model.get_compiled_call(self.config.compile_config) if compiles else model.__call__
        outputs = prefill(model, sequence, model_kwargs)
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


def prefill(model: Any, input_ids: torch.Tensor, model_kwargs: dict[str, Any]) -> Any:
    """The prompt's forward, uncompiled, as generate()'s prefill runs it."""
    inputs = model.prepare_inputs_for_generation(input_ids, is_first_iteration=True, **model_kwargs)
    return model(**inputs, return_dict=True)


def compiles_forward(model: Any, model_kwargs: dict[str, Any], config: Any) -> bool:
    """Whether generate() would compile the forward for this call (its compile_config, cache and quantization)."""
    return bool(model._valid_auto_compile_criteria(model_kwargs, config))


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
