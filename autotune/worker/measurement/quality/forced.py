"""Teacher-forced decoding, and the quality a trial's figures are made of.

Rows of the bundled evaluation text, each a prompt of the workload's input length followed by the workload's output
length of the text's own tokens, run through the generate() call the trial timed (its cache and cache backend, its
compiled step, attention, quantization and speculative method; the same batch, so the same compiled shapes). A logits
processor records, at each decoded position, what the raw logits said, then forces the text's next token, so every
position is judged after the same prefix. As llama.cpp's `perplexity --kl-divergence`: mean KL(reference || trial) of
the next-token distributions, the share of positions where both put the same token first, and perplexity. The
reference keeps its `top_k` most likely tokens per position and one bucket for the rest (reference.py), so the KL is
exact when top_k covers the vocabulary and a close lower bound otherwise.

Token agreement: the workload's own prompts, forced along the reference's greedy continuation of them; the share of
positions where the trial's top token is the reference's (one early flip costs one position, not the rest).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LogitsProcessor

from autotune.data import EVAL_TEXT
from autotune.figures.metrics import KL_DIVERGENCE, PERPLEXITY, PERPLEXITY_DELTA, TOKEN_AGREEMENT, TOP1_AGREEMENT
from autotune.worker.failures import BrokenOutputError

# Runs a forced generation: prompts [rows, prompt_len] and a processor in, the generated tokens [rows, forced] out.
ForcedRun = Callable[[torch.Tensor, LogitsProcessor], torch.Tensor]


@dataclass(frozen=True)
class ForcedRows:
    prompts: torch.Tensor  # [rows, prompt_len] token ids
    targets: torch.Tensor  # [rows, forced_len]: the tokens forced, one per decoded position
    # [rows, forced_len]: the positions judged; None: all. A trace's request asked for fewer tokens than others: its
    # reference continuation ends early, and the positions after it are forced along but not judged.
    judged: torch.Tensor | None = None

    def __getitem__(self, rows: slice) -> ForcedRows:
        judged = None if self.judged is None else self.judged[rows]
        return ForcedRows(self.prompts[rows], self.targets[rows], judged)

    def __len__(self) -> int:
        return self.prompts.shape[0]


def eval_rows(tokenizer: Any, count: int, prompt_len: int, forced_len: int) -> ForcedRows:
    """`count` rows of the evaluation text, each `prompt_len + forced_len` tokens: side by side while the text lasts,
    then from shifted starts (a short text gives overlapping rows, never repeated ones while starts remain)."""
    ids = tokenizer(EVAL_TEXT.read_text(), add_special_tokens=False)["input_ids"]
    span = prompt_len + forced_len
    while len(ids) < span + count:
        ids = ids + ids
    starts = [(row * span) % (len(ids) - span + 1) for row in range(count)]
    rows = torch.tensor([ids[start : start + span] for start in starts])
    return ForcedRows(rows[:, :prompt_len], rows[:, prompt_len:])


@dataclass(frozen=True)
class Layout:
    """How a trial of `batch` rows judges its quality in generations of that batch (the timed shapes): `eval_count`
    rows of evaluation text, then the first `token_count` of the workload's prompts (forced along the reference's
    greedy continuations), packed `batch` to a generation."""

    batch: int
    eval_count: int
    token_count: int

    @property
    def calls(self) -> int:
        return (self.eval_count + self.token_count) // self.batch


MOST_CALLS = 4  # forced generations a trial's quality takes at most: the measuring phase runs at least 5


def layout(batch: int, forced_len: int, positions: int) -> Layout:
    """At least `positions` decoded positions of each kind where the batch allows, in at most MOST_CALLS generations;
    the slots a last generation has left are filled with more evaluation text. At batch 8 and 64 tokens out: 4 rows of
    text and 4 prompts, one call; one prompt at a time: 3 rows of text and the prompt, four calls."""
    wanted = math.ceil(positions / forced_len)
    tokens = min(batch, max(wanted, batch - wanted))
    calls = min(MOST_CALLS, math.ceil((wanted + tokens) / batch))
    if calls * batch - tokens < 1:  # one prompt at a time: at least one row of text
        calls += 1
    return Layout(batch, calls * batch - tokens, tokens)


def reference_rows(batches: set[int], forced_len: int, positions: int) -> int:
    """Rows of evaluation text the reference decodes: what any of these batches judges, packed with prompts or (when
    the prompts are padded and cannot share a generation with the text) in whole batches of text alone."""
    counts = [layout(batch, forced_len, positions).eval_count for batch in batches]
    alone = [math.ceil(count / batch) * batch for count, batch in zip(counts, batches, strict=True)]
    return max(*counts, *alone)


class ForcedDecoding(LogitsProcessor):
    """Forces each row's next token to its target and keeps what `measure` takes from the raw logits at that position.

    A position is kept each time the processor is called for it; the last call wins. Under speculative decoding the
    processor is called for the draft's proposals too (forced the same way, so every proposal is the text and is
    accepted), then for the main model's verification of each position, which comes last."""

    def __init__(self, prompt_len: int, targets: torch.Tensor, measure: Measure) -> None:
        self.prompt_len = prompt_len
        self.targets = targets  # [rows, forced_len], on the model's device
        self.measure = measure
        self.kept: dict[int, tuple[torch.Tensor, ...]] = {}  # position -> what measure took, on the device

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        position = input_ids.shape[1] - self.prompt_len
        if not 0 <= position < self.targets.shape[1] or scores.shape[0] != self.targets.shape[0]:
            return scores
        logq = torch.log_softmax(scores.float(), dim=-1)
        self.kept[position] = self.measure(logq, self.targets[:, position : position + 1], position)
        forced = torch.full_like(scores, -math.inf)
        return forced.scatter_(1, self.targets[:, position : position + 1], 0.0)

    def stacked(self, index: int) -> torch.Tensor:
        """The `index`-th thing measured, [rows, forced_len, ...], on the CPU."""
        return torch.stack([self.kept[p][index] for p in range(self.targets.shape[1])], dim=1).cpu()


# What to keep of one position: (log-probabilities [rows, vocab] in float32, the forced tokens [rows, 1], the position)
# -> tensors, left on the device until the generation ends.
Measure = Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, ...]]


def forced_decode(run: ForcedRun, rows: ForcedRows, device: Any, measure: Measure) -> ForcedDecoding:
    """One forced generation of these rows; an error when it did not follow them (a path that ignored the logits
    processor would otherwise be judged on tokens it chose itself)."""
    targets = rows.targets.to(device)
    processor = ForcedDecoding(rows.prompts.shape[1], targets, measure)
    generated = run(rows.prompts.to(device), processor)
    followed = len(processor.kept) == targets.shape[1] and torch.equal(generated[:, : targets.shape[1]], targets)
    if not followed:
        raise RuntimeError("forced decoding did not follow the forced tokens: this path ignored the logits processor")
    return processor


# ----------------------------------------------------------------------------------------- a trial's figures


def judged_quality(
    generation: Any, reference: dict[str, Any], greedy: list[list[int]] | None, device: Any
) -> dict[str, float]:
    """trial_figures through a generation that was timed (autotune.worker.generation.PaddedGeneration): its batch, its
    prompts (padded where they were), forced along the reference's greedy continuations of them; with none (no greedy
    reference), no token agreement."""
    inputs, mask = generation.input_ids, generation.attention_mask
    along = ForcedRows(inputs.cpu(), reference["targets"][: inputs.shape[0]])
    if greedy is not None:
        along = _along(inputs.cpu(), greedy[: inputs.shape[0]], generation.output_len)
    padded = not bool(mask.all()) or inputs.shape[1] != reference["prompts"].shape[1] or along.judged is not None
    with_mask = lambda rows, processor: generation.forced(rows, processor, mask)  # noqa: E731
    figures = trial_figures(generation.forced, with_mask, reference, along, padded, device)
    if greedy is None:
        figures.pop(TOKEN_AGREEMENT.name)
    return figures


def trial_figures(
    run: ForcedRun, run_prompts: ForcedRun, reference: dict[str, Any], prompts: ForcedRows, padded: bool, device: Any
) -> dict[str, float]:
    """KL, top-1 agreement and perplexity over the reference's rows of text, and token agreement over the workload's
    prompts forced along the reference's greedy continuations (`prompts`: the timed batch, its targets those
    continuations), in generations of the timed batch. Padded prompts (from a prompts file) cannot share a generation
    with the text: `run_prompts` runs them with their attention mask."""
    batch = len(prompts)
    plan = layout(batch, reference["targets"].shape[1], reference["positions"])
    text = ForcedRows(reference["prompts"], reference["targets"])
    top_idx = reference["top_idx"].long()
    if padded:
        count = math.ceil(plan.eval_count / batch) * batch
        judged = _judge(run, batch, text[:count], top_idx[:count], device)
        agreement = _judge(run_prompts, batch, prompts, None, device)
    else:
        count = plan.eval_count
        unused = torch.zeros(plan.token_count, *top_idx.shape[1:], dtype=torch.long)  # prompts have no reference top
        rows = _joined(text[:count], prompts[: plan.token_count])
        both = _judge(run, batch, rows, torch.cat([top_idx[:count], unused]), device)
        judged, agreement = both[:count], both[count:]
    same = agreement.argmax == agreement.targets
    share = same.float().mean() if prompts.judged is None else same[prompts.judged].float().mean()
    return _text_figures(judged, reference, count) | {TOKEN_AGREEMENT.name: share.item()}


def _along(prompts: torch.Tensor, greedy: list[list[int]], width: int) -> ForcedRows:
    """The prompts forced along the reference's greedy continuations of them, `width` tokens each: a continuation
    shorter than that (a trace's request that asked for fewer) is padded with its last token, its padding not judged."""
    if all(len(row) >= width for row in greedy):
        return ForcedRows(prompts, torch.tensor([row[:width] for row in greedy]))
    targets = torch.tensor([(row + row[-1:] * width)[:width] for row in greedy])
    judged = torch.tensor([[position < len(row) for position in range(width)] for row in greedy])
    return ForcedRows(prompts, targets, judged)


@dataclass(frozen=True)
class _Judged:
    """What forced generations kept, per row and position."""

    targets: torch.Tensor  # [rows, forced_len]
    argmax: torch.Tensor  # [rows, forced_len]
    target_logp: torch.Tensor  # [rows, forced_len]
    q_top: torch.Tensor | None  # [rows, forced_len, k]: the trial's log-probabilities of the reference's top tokens

    def __getitem__(self, rows: slice) -> _Judged:
        q_top = None if self.q_top is None else self.q_top[rows]
        return _Judged(self.targets[rows], self.argmax[rows], self.target_logp[rows], q_top)


def _judge(run: ForcedRun, batch: int, rows: ForcedRows, ref_idx: torch.Tensor | None, device: Any) -> _Judged:
    """Forced generations of these rows, `batch` at a time; with the reference's top tokens where given."""
    kept = []
    for start in range(0, len(rows), batch):
        idx = None if ref_idx is None else ref_idx[start : start + batch].to(device)

        def measure(logq: torch.Tensor, target: torch.Tensor, position: int, idx=idx) -> tuple[torch.Tensor, ...]:
            top = () if idx is None else (logq.gather(1, idx[:, position]),)
            return logq.argmax(dim=-1), logq.gather(1, target).squeeze(1), *top

        kept.append(forced_decode(run, rows[start : start + batch], device, measure))
    stacked = [torch.cat([processor.stacked(i) for processor in kept]) for i in range(2 if ref_idx is None else 3)]
    return _Judged(rows.targets, *stacked[:2], stacked[2] if ref_idx is not None else None)


def _joined(first: ForcedRows, second: ForcedRows) -> ForcedRows:
    return ForcedRows(torch.cat([first.prompts, second.prompts]), torch.cat([first.targets, second.targets]))


def _text_figures(judged: _Judged, reference: dict[str, Any], count: int) -> dict[str, float]:
    ref_logp, ref_idx = reference["top_logp"][:count], reference["top_idx"][:count].long()
    assert judged.q_top is not None
    kl = kl_divergence(ref_logp, ref_idx, judged.q_top).mean().item()
    nll = -judged.target_logp.mean().item()
    check_finite(kl, nll)
    perplexity = math.exp(nll)
    return {
        KL_DIVERGENCE.name: max(0.0, kl),
        TOP1_AGREEMENT.name: (judged.argmax == ref_idx[..., 0]).float().mean().item(),
        PERPLEXITY.name: perplexity,
        PERPLEXITY_DELTA.name: perplexity - math.exp(reference["nll"][:count].mean().item()),
    }


def check_finite(*sums: float) -> None:
    if not all(math.isfinite(value) for value in sums):
        raise BrokenOutputError("the model produced NaN or infinite logits on the evaluation text")


def kl_divergence(ref_logp: torch.Tensor, ref_idx: torch.Tensor, q_top: torch.Tensor) -> torch.Tensor:
    """Per position: KL over the reference's top tokens (q_top: the trial's log-probabilities of those tokens), plus
    the remaining mass as one bucket."""
    p_top = ref_logp.exp()
    kl = (p_top * (ref_logp - q_top)).sum(dim=-1)
    p_rest = (1 - p_top.sum(dim=-1)).clamp(min=0)
    q_rest = (1 - q_top.exp().sum(dim=-1)).clamp(min=1e-12)
    has_rest = p_rest > 1e-9
    kl_rest = torch.where(has_rest, p_rest * (p_rest.clamp(min=1e-12).log() - q_rest.log()), torch.zeros_like(kl))
    return kl + kl_rest
