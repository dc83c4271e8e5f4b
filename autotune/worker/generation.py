"""Timed generation: a trial's fixed inputs, run through generate() on one padded batch or through continuous
batching (generate_batch's manager), timed per token."""

from __future__ import annotations

import contextlib
import itertools
import time
from pathlib import Path
from typing import Any, Protocol

import torch

from autotune.data import CORPUS, load_prompts
from autotune.errors import UserError
from autotune.space.plan import Plan
from autotune.specs import WorkloadSpec
from autotune.worker import hooks
from autotune.worker.compat import PAGED, continuous_batching_config, pin_attention, transformers_version
from autotune.worker.failures import BrokenOutputError, UnsupportedError
from autotune.worker.loading import materialize
from autotune.worker.measurement.speed import Iteration
from autotune.worker.measurement.token_clock import TokenClock


class Generation(Protocol):
    def run(self) -> Iteration: ...

    def close(self) -> None: ...


def build_inputs(tokenizer: Any, spec: WorkloadSpec, requests: int) -> list[list[int]]:
    """The token ids of `requests` requests of the workload, the same in every trial.

    Bundled prompts come after context from the bundled corpus so that each is exactly `input_len`
    tokens; prompts from a file keep their own length, cut to their last `input_len` tokens.
    """
    if spec.prompts_path:
        prompts = load_prompts(Path(spec.prompts_path))
        ids = [tokenizer(prompts[i % len(prompts)])["input_ids"][-spec.input_len :] for i in range(requests)]
        if not all(ids):
            raise UserError(f"a prompt of {spec.prompts_path} has no tokens")
        return ids
    prompts = load_prompts()
    filler = tokenizer(CORPUS.read_text(), add_special_tokens=False)["input_ids"]
    inputs = []
    for index in range(requests):
        prompt = tokenizer(prompts[index % len(prompts)], add_special_tokens=False)["input_ids"]
        needed = max(0, spec.input_len - len(prompt))
        start = (index * 997) % max(1, len(filler) - needed)
        context = (filler * (needed // max(1, len(filler)) + 2))[start : start + needed]
        inputs.append((context + prompt)[-spec.input_len :])
    return inputs


def entered(contexts: list[Any]) -> contextlib.ExitStack:
    """A plan's context managers, entered (made anew each time: some cannot be entered twice)."""
    stack = contextlib.ExitStack()
    for call in contexts:
        stack.enter_context(materialize(call))
    return stack


def iteration_from_clock(start: float, end: float, token_times: list[float], batch: int, output: Any) -> Iteration:
    """Figures of one generate() call whose rows all received a token at each of `token_times`."""
    steps = len(token_times)
    decode_s = token_times[-1] - token_times[0]
    gaps = [later - earlier for earlier, later in itertools.pairwise(token_times)]
    return Iteration(
        elapsed_s=end - start,
        ttft_s=token_times[0] - start,
        decode_tok_s=batch * (steps - 1) / decode_s if decode_s > 0 else 0.0,
        e2e_tok_s=batch * steps / (end - start),
        gaps_s=gaps,
        generated=output,
    )


# The end-of-sequence id a trial's generate() is given: no model produces it, so every row runs to the workload's
# length while generate() checks for the end of sequence at each step as it does for a deployment's real one.
# min_new_tokens forced the length before, with a logits processor a deployment does not run: 1.12x the decode
# step's CPU time on the demo model at batch 1 (benchmarks/decode/generate_settings.py, docs/benchmarks.md).
NEVER_PRODUCED_EOS = 2**31 - 1
# What the workload's outputs depend on besides its inputs (cached greedy references are keyed by it).
OUTPUT_HARNESS = "eos-never-produced"


class PaddedGeneration:
    """model.generate on one left-padded batch, with a forced output length."""

    def __init__(self, model: Any, plan: Plan, inputs: list[list[int]], spec: WorkloadSpec, pad_id: int) -> None:
        from transformers import StoppingCriteriaList  # imported here, not in the first timed call

        self.criteria = StoppingCriteriaList
        self.model = model
        width = max(len(ids) for ids in inputs)
        padded = [[pad_id] * (width - len(ids)) + ids for ids in inputs]
        mask = [[0] * (width - len(ids)) + [1] * len(ids) for ids in inputs]
        self.input_ids = torch.tensor(padded, device=model.device)
        self.attention_mask = torch.tensor(mask, device=model.device)
        self.output_len = spec.output_len
        self.pad_id = pad_id
        self.kwargs = materialize(plan.generate) | hooks.generate_arguments(plan)  # once: a new CompileConfig per call
        if model.generation_config.eos_token_id is not None:  # a model with no end of sequence checks for none
            self.kwargs.setdefault("eos_token_id", NEVER_PRODUCED_EOS)
        self.plan_contexts = plan.contexts  # generate() runs under torch.no_grad by itself, inside these

    def contexts(self) -> contextlib.ExitStack:
        return entered(self.plan_contexts)

    def run(self) -> Iteration:
        clock = TokenClock(self.model.device)
        start = clock.start()
        with self.contexts():
            output = self._generate(clock)
        end = clock.stop()
        generated = output[:, self.input_ids.shape[1] :].tolist()
        return iteration_from_clock(start, end, clock.times(start), self.input_ids.shape[0], generated)

    def _generate(self, clock: TokenClock) -> Any:
        return self.model.generate(
            input_ids=self.input_ids,
            attention_mask=self.attention_mask,
            max_new_tokens=self.output_len,
            do_sample=False,
            pad_token_id=self.pad_id,
            stopping_criteria=self.criteria([clock]),
            **self.kwargs,
        )

    def forced(self, prompts: torch.Tensor, processor: Any, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The timed call with these prompts (the timed batch and input length, so the same compiled shapes) and a
        logits processor that forces each next token: the tokens it generated, [rows, output_len]."""
        from transformers import LogitsProcessorList

        with self.contexts():
            output = self.model.generate(
                input_ids=prompts,
                attention_mask=torch.ones_like(prompts) if attention_mask is None else attention_mask,
                max_new_tokens=self.output_len,
                do_sample=False,
                pad_token_id=self.pad_id,
                logits_processor=LogitsProcessorList([processor]),
                **self.kwargs,
            )
        return output[:, prompts.shape[1] :]

    def close(self) -> None:
        """Nothing runs between calls."""


class ContinuousGeneration:
    """Continuous batching (the manager behind generate_batch) on the same inputs, with per-token timestamps.

    The manager, its paged cache and its CUDA graphs are set up once, in the constructor, outside the timed
    runs, as a server sets them up once before it takes requests.
    """

    def __init__(self, model: Any, plan: Plan, inputs: list[list[int]], spec: WorkloadSpec) -> None:
        from transformers import GenerationConfig

        self.inputs = inputs
        self.output_len = spec.output_len
        # No eos_token_id: continuous batching then disables early stopping, so every request is full length.
        generation_config = GenerationConfig(max_new_tokens=spec.output_len, do_sample=False)
        kwargs = materialize(plan.continuous)
        config = continuous_batching_config(kwargs)
        self.model = model
        loaded = model.config._attn_implementation
        self.restore_attention = pin_attention(model, kwargs)
        self.manager = model.init_continuous_batching(
            generation_config=generation_config, continuous_batching_config=config
        )
        check_attention_kept(loaded, model.config._attn_implementation)
        self.manager.warmup()
        self.manager.start()

    def run(self) -> Iteration:
        start = time.perf_counter()
        request_ids = self.manager.add_requests(
            inputs=self.inputs, max_new_tokens=self.output_len, record_timestamps=True
        )
        results = self._wait_for(set(request_ids))
        end = time.perf_counter()
        outputs = [results[request_id] for request_id in request_ids if request_id in results]
        _check_complete(outputs, len(self.inputs), self.output_len)
        return iteration_from_timestamps(outputs, start, end)

    def _wait_for(self, pending: set[str]) -> dict[str, Any]:
        results: dict[str, Any] = {}
        while pending:
            result = self.manager.get_result(timeout=1)
            if result is None:
                if not self.manager.is_running():
                    raise RuntimeError("the continuous batching manager stopped with requests pending")
                continue
            if result.request_id in pending and result.is_finished():
                results[result.request_id] = result
                pending.discard(result.request_id)
        return results

    def close(self) -> None:
        self.manager.stop(block=True, timeout=30)
        if self.restore_attention is not None:
            self.model.set_attn_implementation(self.restore_attention)


def check_attention_kept(loaded: str, running: str) -> None:
    """Continuous batching runs the paged form of the loaded attention (eager: paged|eager), never another one."""
    if running.removeprefix(PAGED) != loaded.removeprefix(PAGED):
        raise UnsupportedError(
            f"transformers {transformers_version()} switched continuous batching from {loaded} attention to "
            f"{running}, so {loaded} cannot be measured under it here",
            combination=True,  # the attention runs without continuous batching
        )


def iteration_from_timestamps(outputs: list[Any], start: float, end: float) -> Iteration:
    """Figures of a generate_batch call from each request's creation time and per-token timestamps."""
    first = [out.timestamps[0] for out in outputs]
    last = [out.timestamps[-1] for out in outputs]
    counts = [len(out.generated_tokens) for out in outputs]
    decode_s = max(last) - min(first)
    gaps = [b - a for out in outputs for a, b in zip(out.timestamps, out.timestamps[1:], strict=False)]
    waits = [ft - out.created_time for ft, out in zip(first, outputs, strict=True)]
    return Iteration(
        elapsed_s=end - start,
        ttft_s=sum(waits) / len(outputs),
        decode_tok_s=sum(n - 1 for n in counts) / decode_s if decode_s > 0 else 0.0,
        e2e_tok_s=sum(counts) / (end - start),
        gaps_s=gaps,
        generated=[list(out.generated_tokens) for out in outputs],
    )


def _check_complete(outputs: list[Any], expected: int, length: int) -> None:
    failed = [out for out in outputs if out.error is not None]
    if failed:
        raise RuntimeError(f"continuous batching failed a request: {failed[0].error}")
    if len(outputs) != expected:
        raise BrokenOutputError(f"continuous batching returned {len(outputs)} of {expected} requests")
    short = [len(out.generated_tokens) for out in outputs if len(out.generated_tokens) != length]
    if short:
        raise BrokenOutputError(f"continuous batching stopped early: {short[0]} of {length} tokens")


def make_generation(model: Any, plan: Plan, inputs: list[list[int]], spec: WorkloadSpec, pad_id: int) -> Generation:
    if plan.batching == "continuous":
        return ContinuousGeneration(model, plan, inputs, spec)
    return PaddedGeneration(model, plan, inputs, spec, pad_id)
