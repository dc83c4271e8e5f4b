"""The prefill path: what studies before 2026-11-27 stored as quality, one forward pass over windows of the text, with
no cache and no compiled step. No trial measures it any more; benchmarks/quality/quality_paths.py and the tests set it
beside the decoding path's figure, to show what it missed."""

from __future__ import annotations

import math
from typing import Any

import torch

from autotune.data import EVAL_TEXT
from autotune.figures.metrics import KL_DIVERGENCE, PERPLEXITY, TOP1_AGREEMENT
from autotune.worker.measurement.quality.forced import check_finite, kl_divergence


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
        kl_sum += kl_divergence(ref_logp, ref_idx, logq.gather(1, ref_idx)).sum().item()
        agree += (logq.argmax(dim=-1) == ref_idx[:, 0]).sum().item()
        nll_sum -= logq.gather(1, window[1:, None]).sum().item()
        count += logq.shape[0]
    check_finite(kl_sum, nll_sum)
    return {
        KL_DIVERGENCE.name: max(0.0, kl_sum / count),
        TOP1_AGREEMENT.name: agree / count,
        PERPLEXITY.name: math.exp(nll_sum / count),
    }


def _prefill_log_probs(model: Any, window: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=window[None].to(model.device), use_cache=False).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).cpu()
