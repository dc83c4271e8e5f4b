"""Timed generation: a trial's fixed inputs, run through generate() on one padded batch or through continuous
batching (generate_batch's manager), timed per token."""

from __future__ import annotations

import contextlib
import itertools
import time
from dataclasses import dataclass, replace
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
from autotune.worker.measurement.speed import Iteration, Served
from autotune.worker.measurement.token_clock import TokenClock
from autotune.worker.prefix_reuse import PrefixHits


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


@dataclass(frozen=True)
class Call:
    """One timed generate() call: when it began and ended, when each step's token came, what each row generated."""

    start: float
    end: float
    times: list[float]
    generated: list[list[int]]
    cache: Any = None  # the cache generate() left, where the call asked for it (a prompt cache to keep)


class RowLengths:
    """A stopping criterion that ends each row at its own request's length, as a real end of sequence would end it:
    generate() pads a row that ended and returns when its last row ends."""

    def __init__(self, lengths: list[int], prompt_width: int, device: torch.device) -> None:
        self.lengths = torch.tensor(lengths, device=device)
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        return self.lengths <= input_ids.shape[1] - self.prompt_width


class PaddedGeneration:
    """model.generate on one left-padded batch: every row to the workload's output length, or each to its own
    (`lengths`: a trace's requests)."""

    def __init__(
        self,
        model: Any,
        plan: Plan,
        inputs: list[list[int]],
        spec: WorkloadSpec,
        pad_id: int,
        lengths: list[int] | None = None,
    ) -> None:
        from transformers import StoppingCriteriaList  # imported here, not in the first timed call

        self.criteria = StoppingCriteriaList
        self.model = model
        width = max(len(ids) for ids in inputs)
        padded = [[pad_id] * (width - len(ids)) + ids for ids in inputs]
        mask = [[0] * (width - len(ids)) + [1] * len(ids) for ids in inputs]
        self.input_ids = torch.tensor(padded, device=model.device)
        self.attention_mask = torch.tensor(mask, device=model.device)
        self.lengths = lengths
        self.row_lengths = RowLengths(lengths, width, model.device) if lengths else None
        self.output_len = max(lengths) if lengths else spec.output_len
        self.pad_id = pad_id
        self.kwargs = materialize(plan.generate) | hooks.generate_arguments(plan)  # once: a new CompileConfig per call
        if model.generation_config.eos_token_id is not None:  # a model with no end of sequence checks for none
            self.kwargs.setdefault("eos_token_id", NEVER_PRODUCED_EOS)
        self.plan_contexts = plan.contexts  # generate() runs under torch.no_grad by itself, inside these

    def contexts(self) -> contextlib.ExitStack:
        return entered(self.plan_contexts)

    def run(self) -> Iteration:
        call = self.call()
        return iteration_from_clock(call.start, call.end, call.times, self.input_ids.shape[0], call.generated)

    def call(self, prompt_cache: Any = None, keep_cache: bool = False) -> Call:
        """One timed call: every row's tokens, each cut at its own length. `prompt_cache`: a cache holding the start of
        the inputs already (generate() prefills the rest); `keep_cache`: the call returns the cache it left."""
        clock = TokenClock(self.model.device)
        start = clock.start()
        with self.contexts():
            output = self._generate(clock, prompt_cache, keep_cache)
        end = clock.stop()
        sequences = output.sequences if keep_cache else output
        generated = sequences[:, self.input_ids.shape[1] :].tolist()
        if self.lengths:
            generated = [row[:length] for row, length in zip(generated, self.lengths, strict=True)]
        return Call(start, end, clock.times(start), generated, output.past_key_values if keep_cache else None)

    def _generate(self, clock: TokenClock, prompt_cache: Any = None, keep_cache: bool = False) -> Any:
        criteria = [clock] if self.row_lengths is None else [clock, self.row_lengths]
        cached = {"past_key_values": prompt_cache} if prompt_cache is not None else {}
        kept = {"return_dict_in_generate": True} if keep_cache else {}
        return self.model.generate(
            input_ids=self.input_ids,
            attention_mask=self.attention_mask,
            max_new_tokens=self.output_len,
            do_sample=False,
            pad_token_id=self.pad_id,
            stopping_criteria=self.criteria(criteria),
            **self.kwargs,
            **cached,
            **kept,
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

    Its cache keeps the full pages of the prompts it served for a later prompt that begins with them (prefix sharing,
    on by default from transformers 5.17): the same prompts sent again would find every page of theirs there, as no
    deployment's new requests do (on the demo model, 8 prompts of 128 tokens: time to first token 15 ms against 54,
    /tmp/exp's cb_share.py in the closing note of issue 68). Where the requests share no prefix it is turned off; where
    they do (`shared_prefixes`), each run gets a new manager, set up after the run's clock stops.
    """

    def __init__(
        self,
        model: Any,
        plan: Plan,
        inputs: list[list[int]],
        spec: WorkloadSpec,
        lengths: list[int] | None = None,
        shared_prefixes: bool = False,
        one_at_a_time: bool = False,
    ) -> None:
        from transformers import GenerationConfig

        self.inputs = inputs
        self.lengths = lengths
        self.one_at_a_time = one_at_a_time  # a trace's requests each sent once the one before it has ended
        self.output_len = max(lengths) if lengths else spec.output_len
        # No eos_token_id: continuous batching then disables early stopping, so every request is full length.
        self.generation_config = GenerationConfig(max_new_tokens=self.output_len, do_sample=False)
        kwargs = materialize(plan.continuous)
        self.config = continuous_batching_config(kwargs)
        self.shares = getattr(self.config, "allow_block_sharing", False)
        if self.shares and not shared_prefixes:
            self.config.allow_block_sharing = self.shares = False
        self.model = model
        loaded = model.config._attn_implementation
        self.restore_attention = pin_attention(model, kwargs)
        self.manager = self._started()
        check_attention_kept(loaded, model.config._attn_implementation)

    def _started(self) -> Any:
        manager = self.model.init_continuous_batching(
            generation_config=self.generation_config, continuous_batching_config=self.config
        )
        manager.warmup()
        manager.start()
        return manager

    def run(self) -> Iteration:
        hits = PrefixHits() if self.shares and self.lengths else None
        start = time.perf_counter()
        if self.lengths and self.one_at_a_time:
            request_ids, results, starts = self._one_at_a_time()
        elif self.lengths:  # a trace's requests, all at once, each asking for its own tokens
            request_ids = [
                self.manager.add_request(ids, max_new_tokens=length, record_timestamps=True)
                for ids, length in zip(self.inputs, self.lengths, strict=True)
            ]
            results, starts = self._wait_for(set(request_ids)), [start] * len(request_ids)
        else:
            request_ids = self.manager.add_requests(
                inputs=self.inputs, max_new_tokens=self.output_len, record_timestamps=True
            )
            results, starts = self._wait_for(set(request_ids)), [start] * len(request_ids)
        end = time.perf_counter()
        if hits is not None:
            hits.close()
        if self.shares:  # the next run finds none of these prompts' pages
            self.manager.stop(block=True, timeout=30)
            self.manager = self._started()
        outputs = [results[request_id] for request_id in request_ids if request_id in results]
        _check_complete(outputs, len(self.inputs), self.lengths or [self.output_len] * len(self.inputs))
        iteration = iteration_from_timestamps(outputs, start, end, alone=self.one_at_a_time)
        if not self.lengths:
            return iteration
        served = served_from_timestamps(outputs, starts)
        reused = hits.tokens if hits is not None and hits.counting else None if self.shares else 0
        return replace(iteration, served=replace(served, input_tokens=sum(map(len, self.inputs)), reused=reused))

    def _one_at_a_time(self) -> tuple[list[str], dict[str, Any], list[float]]:
        """Each request sent once the one before it has ended, as the latency kind sends them: their ids, results and
        the times they were sent."""
        request_ids, results, starts = [], {}, []
        for ids, length in zip(self.inputs, self.lengths or [], strict=True):
            starts.append(time.perf_counter())
            request_ids.append(self.manager.add_request(ids, max_new_tokens=length, record_timestamps=True))
            results |= self._wait_for({request_ids[-1]})
        return request_ids, results, starts

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


def iteration_from_timestamps(outputs: list[Any], start: float, end: float, alone: bool = False) -> Iteration:
    """Figures of a generate_batch call from each request's creation time and per-token timestamps; `alone`: the
    requests ran one after the other, so each decoded in its own span."""
    first = [out.timestamps[0] for out in outputs]
    last = [out.timestamps[-1] for out in outputs]
    counts = [len(out.generated_tokens) for out in outputs]
    decode_s = sum(b - a for a, b in zip(first, last, strict=True)) if alone else max(last) - min(first)
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


def served_from_timestamps(outputs: list[Any], starts: list[float]) -> Served:
    """Each request of a trace under continuous batching, from when it was added (`starts`, each request's): it
    decodes each request to its own end only, so its row steps are the tokens asked for."""
    lengths = [len(out.generated_tokens) for out in outputs]
    return Served(
        ttfts_s=[out.timestamps[0] - start for out, start in zip(outputs, starts, strict=True)],
        e2es_s=[out.timestamps[-1] - start for out, start in zip(outputs, starts, strict=True)],
        gaps_s=[[b - a for a, b in itertools.pairwise(out.timestamps)] for out in outputs],
        lengths=lengths,
        row_steps=sum(lengths),
    )


def _check_complete(outputs: list[Any], expected: int, lengths: list[int]) -> None:
    failed = [out for out in outputs if out.error is not None]
    if failed:
        raise RuntimeError(f"continuous batching failed a request: {failed[0].error}")
    if len(outputs) != expected:
        raise BrokenOutputError(f"continuous batching returned {len(outputs)} of {expected} requests")
    for out, length in zip(outputs, lengths, strict=True):
        if len(out.generated_tokens) != length:
            raise BrokenOutputError(
                f"continuous batching generated {len(out.generated_tokens)} of the {length} tokens a request asked for"
            )


def make_generation(model: Any, plan: Plan, inputs: list[list[int]], spec: WorkloadSpec, pad_id: int) -> Generation:
    if plan.batching == "continuous":
        return ContinuousGeneration(model, plan, inputs, spec)
    return PaddedGeneration(model, plan, inputs, spec, pad_id)
