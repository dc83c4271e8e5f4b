"""Quality against the reference configuration, teacher-forced on the bundled evaluation text.

As llama.cpp's `perplexity --kl-divergence`: mean KL(reference || trial) of the next-token
distributions, the share of positions where both pick the same top token, and perplexity. The
reference keeps its `top_k` most likely tokens per position and one bucket for the rest, so the KL is
exact when top_k covers the vocabulary and a close lower bound otherwise. And the checks of a trial's generated
tokens against the reference's greedy ones: broken output (empty, constant, repeating where the reference does not),
and the agreement of their prefixes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from autotune.data import EVAL_TEXT
from autotune.specs import QualitySpec
from autotune.worker.failures import BrokenOutputError


def eval_windows(tokenizer: Any, spec: QualitySpec, max_positions: int | None) -> torch.Tensor:
    """[windows, window] token ids of the evaluation text, in non-overlapping windows."""
    ids = tokenizer(EVAL_TEXT.read_text(), add_special_tokens=False)["input_ids"][: spec.max_tokens]
    window = min(spec.window, max_positions or spec.window, len(ids))
    count = max(1, len(ids) // window)
    return torch.tensor(ids[: count * window]).view(count, window)


@torch.no_grad()
def _log_probs(model: Any, windows: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Per window: log-probabilities [window - 1, vocab] (float32) and the tokens they predict."""
    for window in windows:
        input_ids = window[None].to(model.device)
        logits = model(input_ids=input_ids, use_cache=False).logits[0, :-1].float()
        if not torch.isfinite(logits).all():
            raise BrokenOutputError("the model produced NaN or infinite logits on the evaluation text")
        yield torch.log_softmax(logits, dim=-1).cpu(), window[1:]


def compute_reference(model: Any, windows: torch.Tensor, top_k: int) -> dict[str, Any]:
    top_logp, top_idx, nll = [], [], []
    for logp, targets in _log_probs(model, windows):
        values, indices = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
        top_logp.append(values)
        top_idx.append(indices.to(torch.int32))
        nll.append(-logp.gather(1, targets[:, None]).squeeze(1))
    return {
        "windows": windows,
        "top_logp": torch.cat(top_logp),
        "top_idx": torch.cat(top_idx),
        "perplexity": math.exp(torch.cat(nll).mean().item()),
    }


def save_reference(reference: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    torch.save(reference, staging)
    staging.replace(path)


def load_reference(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)


def compare_with_reference(model: Any, reference: dict[str, Any]) -> dict[str, float]:
    kl_sum, agree, count, nll_sum = 0.0, 0, 0, 0.0
    offset = 0
    for logq, targets in _log_probs(model, reference["windows"]):
        positions = logq.shape[0]
        ref_logp = reference["top_logp"][offset : offset + positions]
        ref_idx = reference["top_idx"][offset : offset + positions].long()
        offset += positions
        kl_sum += _kl_divergence(ref_logp, ref_idx, logq).sum().item()
        agree += (logq.argmax(dim=-1) == ref_idx[:, 0]).sum().item()
        nll_sum += -logq.gather(1, targets[:, None]).sum().item()
        count += positions
    perplexity = math.exp(nll_sum / count)
    return {
        "kl_divergence": max(0.0, kl_sum / count),
        "top1_agreement": agree / count,
        "perplexity": perplexity,
        "perplexity_delta": perplexity - reference["perplexity"],
    }


def _kl_divergence(ref_logp: torch.Tensor, ref_idx: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Per position: KL over the reference's top tokens, plus the remaining mass as one bucket."""
    q_top = logq.gather(1, ref_idx)
    p_top = ref_logp.exp()
    kl = (p_top * (ref_logp - q_top)).sum(dim=-1)
    p_rest = (1 - p_top.sum(dim=-1)).clamp(min=0)
    q_rest = (1 - q_top.exp().sum(dim=-1)).clamp(min=1e-12)
    has_rest = p_rest > 1e-9
    kl_rest = torch.where(has_rest, p_rest * (p_rest.clamp(min=1e-12).log() - q_rest.log()), torch.zeros_like(kl))
    return kl + kl_rest


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
