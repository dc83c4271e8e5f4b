"""Quality against the reference configuration, measured on the path the trial's speed came from.

Teacher-forced decoding: rows of the bundled evaluation text, each a prompt of the workload's input length followed by
the workload's output length of the text's own tokens, run through the generate() call the trial timed (its cache and
cache backend, its compiled step, attention, quantization and speculative method; the same batch, so the same
compiled shapes). A logits processor records, at each decoded position, what the raw logits said, then forces the
text's next token, so every position is judged after the same prefix. As llama.cpp's `perplexity --kl-divergence`:
mean KL(reference || trial) of the next-token distributions, the share of positions where both put the same token
first, and perplexity. The reference keeps its `top_k` most likely tokens per position and one bucket for the rest,
so the KL is exact when top_k covers the vocabulary and a close lower bound otherwise. The reference runs the same
way, through its own decoding path.

Token agreement: the workload's own prompts, forced along the reference's greedy continuation of them; the share of
positions where the trial's top token is the reference's (one early flip costs one position, not the rest). Greedy
agreement: the share of each reference continuation the trial's own timed outputs reproduced before diverging.
And the checks of those outputs: broken (empty, constant, repeating where the reference does not); degenerate (tier 0:
the share of its free-running generations that are empty, one token, a repetition loop, or run to the limit where the
reference stopped, each where the reference's own row is not).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import LogitsProcessor

from autotune.data import EVAL_TEXT
from autotune.figures.metrics import (
    DEGENERATE_SHARE,
    GENERATIONS_JUDGED,
    KL_DIVERGENCE,
    PERPLEXITY,
    PERPLEXITY_DELTA,
    TOKEN_AGREEMENT,
    TOP1_AGREEMENT,
)
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


# ----------------------------------------------------------------------------------------- the reference


def compute_reference(
    run: ForcedRun, batch: int, rows: ForcedRows, device: Any, top_k: int, positions: int
) -> dict[str, Any]:
    """The reference's own decoding path over these rows, `batch` rows per generation: per position its `top_k` most
    likely tokens with their log-probabilities, and its perplexity of the text; `positions`, what a trial judges at
    least, is kept with them."""

    def measure(logq: torch.Tensor, target: torch.Tensor, _: int) -> tuple[torch.Tensor, ...]:
        values, indices = logq.topk(min(top_k, logq.shape[-1]), dim=-1)
        return values, indices.to(torch.int32), -logq.gather(1, target).squeeze(1)

    kept = [forced_decode(run, rows[start : start + batch], device, measure) for start in range(0, len(rows), batch)]
    nll = torch.cat([processor.stacked(2) for processor in kept])
    return {
        "path": "decode",
        "positions": positions,
        "prompts": rows.prompts,
        "targets": rows.targets,
        "top_logp": torch.cat([processor.stacked(0) for processor in kept]),  # [rows, forced_len, k]
        "top_idx": torch.cat([processor.stacked(1) for processor in kept]),
        "nll": nll,  # [rows, forced_len]: a trial's perplexity is set against the reference's on the rows it judged
        PERPLEXITY.name: math.exp(nll.mean().item()),
    }


def save_reference(reference: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    torch.save(reference, staging)
    staging.replace(path)


def load_reference(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)


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
    kl = _kl_divergence(ref_logp, ref_idx, judged.q_top).mean().item()
    nll = -judged.target_logp.mean().item()
    _check_finite(kl, nll)
    perplexity = math.exp(nll)
    return {
        KL_DIVERGENCE.name: max(0.0, kl),
        TOP1_AGREEMENT.name: (judged.argmax == ref_idx[..., 0]).float().mean().item(),
        PERPLEXITY.name: perplexity,
        PERPLEXITY_DELTA.name: perplexity - math.exp(reference["nll"][:count].mean().item()),
    }


def _check_finite(*sums: float) -> None:
    if not all(math.isfinite(value) for value in sums):
        raise BrokenOutputError("the model produced NaN or infinite logits while decoding the evaluation text")


def _kl_divergence(ref_logp: torch.Tensor, ref_idx: torch.Tensor, q_top: torch.Tensor) -> torch.Tensor:
    """Per position: KL over the reference's top tokens (q_top: the trial's log-probabilities of those tokens), plus
    the remaining mass as one bucket."""
    p_top = ref_logp.exp()
    kl = (p_top * (ref_logp - q_top)).sum(dim=-1)
    p_rest = (1 - p_top.sum(dim=-1)).clamp(min=0)
    q_rest = (1 - q_top.exp().sum(dim=-1)).clamp(min=1e-12)
    has_rest = p_rest > 1e-9
    kl_rest = torch.where(has_rest, p_rest * (p_rest.clamp(min=1e-12).log() - q_rest.log()), torch.zeros_like(kl))
    return kl + kl_rest


# ------------------------------------------------------------------------------------- the prefill path

# What studies before 2026-11-27 stored as quality: one forward pass over windows of the text, with no cache and no
# compiled step. No trial measures it any more; benchmarks/quality/quality_paths.py and the tests set it beside the
# decoding path's figure, to show what it missed.


def eval_windows(tokenizer: Any, window: int = 256, max_tokens: int = 2048) -> torch.Tensor:
    """[windows, window] token ids of the evaluation text, in non-overlapping windows."""
    ids = tokenizer(EVAL_TEXT.read_text(), add_special_tokens=False)["input_ids"][:max_tokens]
    window = min(window, len(ids))
    count = max(1, len(ids) // window)
    return torch.tensor(ids[: count * window]).view(count, window)


@torch.no_grad()
def prefill_figures(model: Any, reference_model: Any, windows: torch.Tensor, top_k: int = 1024) -> dict[str, float]:
    """KL, top-1 agreement and perplexity of `model` against `reference_model`, each window in one forward pass."""
    kl_sum, agree, nll_sum, count = 0.0, 0, 0.0, 0
    for window in windows:
        logp = _prefill_log_probs(reference_model, window)
        logq = _prefill_log_probs(model, window)
        ref_logp, ref_idx = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
        kl_sum += _kl_divergence(ref_logp, ref_idx, logq.gather(1, ref_idx)).sum().item()
        agree += (logq.argmax(dim=-1) == ref_idx[:, 0]).sum().item()
        nll_sum -= logq.gather(1, window[1:, None]).sum().item()
        count += logq.shape[0]
    return {
        KL_DIVERGENCE.name: max(0.0, kl_sum / count),
        TOP1_AGREEMENT.name: agree / count,
        PERPLEXITY.name: math.exp(nll_sum / count),
    }


def _prefill_log_probs(model: Any, window: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=window[None].to(model.device), use_cache=False).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).cpu()


# ------------------------------------------------------------------------------------------- outputs


def prefix_agreement(generated: list[list[int]], reference: list[list[int]]) -> float:
    """Mean share of each reference continuation that greedy decoding reproduced before diverging."""
    shares = []
    for tokens, expected in zip(generated, reference, strict=False):
        same = 0
        for token, wanted in zip(tokens, expected, strict=False):
            if token != wanted:
                break
            same += 1
        shares.append(same / len(expected) if expected else 1.0)
    return sum(shares) / len(shares) if shares else 0.0


def broken_reason(generated: list[list[int]], reference: list[list[int]] | None) -> str | None:
    """Why this output is unusable, or None: empty continuations, or one token repeated throughout."""
    if not generated or any(len(tokens) == 0 for tokens in generated):
        return "the model generated an empty continuation"
    repeated = [
        row
        for row, tokens in enumerate(generated)
        if len(tokens) > 1 and len(set(tokens)) == 1 and not _is_repetition(reference, row)
    ]
    if len(repeated) * 2 >= len(generated):
        token = generated[repeated[0]][0]
        return f"{len(repeated)} of {len(generated)} continuations repeat one token ({token}) throughout"
    return None


def _is_repetition(reference: list[list[int]] | None, row: int) -> bool:
    """The reference itself repeats one token here, so repetition is what this model does."""
    if reference is None or row >= len(reference):
        return False
    return len(set(reference[row])) <= 1


# ------------------------------------------------------------------------------- tier 0: degenerate outputs

# A trial's timed generate() is given an end-of-sequence id no model produces (worker/generation.py), so every row runs
# to the workload's length; each greedy token depends only on the tokens before it, so a row cut at the model's first
# real end-of-sequence token is what generate() with that id would have returned. The reference's greedy rows are cut
# the same way. No generation is run for it.
LOOP_REPEATS = 3  # a repetition loop: the row ends in at least this many repeats of one span of tokens
LOOP_SHARE = 3  # ... covering at least 1/LOOP_SHARE of the row

EMPTY, ONE_TOKEN, LOOP = "empty", "one token", "repetition loop"
NO_STOP = "ran to the limit where the reference stopped"


def stopped_at(tokens: list[int], eos_ids: frozenset[int]) -> list[int]:
    """The row as generate() with the model's real end-of-sequence tokens returns it: cut before the first."""
    for index, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[:index]
    return tokens


def loop_period(tokens: list[int]) -> int | None:
    """The period of the repetition the row ends in, when it repeats at least LOOP_REPEATS times over at least
    1/LOOP_SHARE of the row; None otherwise."""
    for period in range(1, len(tokens) // LOOP_REPEATS + 1):
        tail = period
        while tail < len(tokens) and tokens[-tail - 1] == tokens[-tail - 1 + period]:
            tail += 1
        if tail >= LOOP_REPEATS * period and tail * LOOP_SHARE >= len(tokens):
            return period
    return None


def _faults(tokens: list[int], ran_to_limit: bool) -> list[str]:
    """What is degenerate in one cut row, each kind in the order a reader would name it."""
    found = [EMPTY] if not tokens else []
    if len(tokens) > 1 and len(set(tokens)) == 1:
        found.append(ONE_TOKEN)
    elif loop_period(tokens) is not None:
        found.append(LOOP)
    if ran_to_limit:
        found.append(NO_STOP)
    return found


def degenerate_kind(row: list[int], reference: list[int] | None, eos_ids: frozenset[int]) -> str | None:
    """Why the trial's row is degenerate where the reference's row is not (None: it is not, or the reference's row is
    degenerate the same way, which is then what this model does)."""
    cut = stopped_at(row, eos_ids)
    if reference is None:
        return next(iter(kind for kind in _faults(cut, ran_to_limit=False)), None)
    reference_cut = stopped_at(reference, eos_ids)
    reference_stopped = len(reference_cut) < len(reference)
    trial = _faults(cut, ran_to_limit=reference_stopped and len(cut) == len(row))
    expected = set(_faults(reference_cut, ran_to_limit=False))
    return next((kind for kind in trial if kind not in expected), None)


def degenerate_figures(
    generated: list[list[int]], reference: list[list[int]] | None, eos_ids: frozenset[int]
) -> dict[str, float]:
    """Tier 0: the share of the trial's own generations that are degenerate where the reference's are not."""
    kinds = [
        degenerate_kind(row, reference[index] if reference and index < len(reference) else None, eos_ids)
        for index, row in enumerate(generated)
    ]
    degenerate = sum(kind is not None for kind in kinds)
    return {DEGENERATE_SHARE.name: degenerate / len(generated) if generated else 0.0, GENERATIONS_JUDGED: len(kinds)}


def eos_ids_of(model: Any) -> frozenset[int]:
    """The model's own end-of-sequence tokens (its generation config's), none where it has none."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, list) else [eos])
