"""The reference's side of forced decoding: its own decoding path over rows of the evaluation text, what of it a
trial is judged against (per position its most likely tokens with their log-probabilities, and its perplexity), and
the file that keeps it for every trial of the study on this machine."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from autotune.figures.metrics import PERPLEXITY
from autotune.worker.measurement.quality.forced import ForcedRows, ForcedRun, forced_decode


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
