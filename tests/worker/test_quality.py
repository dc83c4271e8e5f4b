"""Quality against the reference (autotune.worker.measurement.quality), on a bigram model whose distributions are known.

A bigram model's next-token distribution depends on the current token only, so every KL, agreement and
perplexity below is worked out by hand from the three-token distributions written here.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import pytest
import torch

from autotune.worker.failures import BrokenOutputError
from autotune.worker.measurement.quality import (
    compare_with_reference,
    compute_reference,
    load_reference,
    save_reference,
)

P = [0.5, 0.25, 0.25]  # the reference's next-token distribution
Q = [0.25, 0.5, 0.25]  # a trial's: KL(P || Q) = 0.5 ln 2 + 0.25 ln 0.5 = 0.25 ln 2
# Six predicted positions; the targets (the next tokens) are 1, 2, 0, 2, 1, 0.
WINDOWS = torch.tensor([[0, 1, 2, 0, 2, 1, 0]])


class Output(NamedTuple):
    logits: torch.Tensor  # [batch, positions, vocab], what the quality code reads of a causal LM's output


class BigramModel(torch.nn.Module):
    """logits[t] = log(distributions[current token t]): a real torch model with known outputs."""

    def __init__(self, distributions: list[list[float]]) -> None:
        super().__init__()
        self.table = torch.nn.Embedding.from_pretrained(torch.tensor(distributions).log())

    @property
    def device(self) -> torch.device:
        return self.table.weight.device

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False) -> Output:
        return Output(self.table(input_ids))


def same_for_every_token(distribution: list[float]) -> BigramModel:
    return BigramModel([distribution] * 3)


def test_the_reference_against_itself_has_no_divergence_full_agreement_and_its_own_perplexity():
    model = same_for_every_token(P)
    reference = compute_reference(model, WINDOWS, top_k=3)
    # targets 1, 2, 0, 2, 1, 0: four at probability 1/4, two at 1/2 -> mean NLL (10/6) ln 2
    assert reference["perplexity"] == pytest.approx(2 ** (5 / 3))
    quality = compare_with_reference(model, reference)
    assert quality["kl_divergence"] == pytest.approx(0.0, abs=1e-7)
    assert quality["top1_agreement"] == 1.0
    assert quality["perplexity_delta"] == pytest.approx(0.0, abs=1e-6)


def test_kl_of_known_distributions_is_the_hand_computed_value_when_top_k_covers_the_vocabulary():
    reference = compute_reference(same_for_every_token(P), WINDOWS, top_k=3)
    quality = compare_with_reference(same_for_every_token(Q), reference)
    assert quality["kl_divergence"] == pytest.approx(0.25 * math.log(2))
    assert quality["top1_agreement"] == 0.0  # the reference picks token 0, the trial token 1
    # the trial gives targets 1, 2, 0, 2, 1, 0 probabilities 1/2, 1/4, 1/4, 1/4, 1/2, 1/4: mean NLL (10/6) ln 2
    assert quality["perplexity"] == pytest.approx(2 ** (5 / 3))


def test_with_fewer_top_tokens_the_rest_is_one_bucket_and_the_kl_a_lower_bound():
    reference = compute_reference(same_for_every_token(P), WINDOWS, top_k=1)
    quality = compare_with_reference(same_for_every_token(Q), reference)
    # token 0: 0.5 ln(0.5 / 0.25); the rest: 0.5 ln(0.5 / 0.75)
    bucketed = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    assert quality["kl_divergence"] == pytest.approx(bucketed)
    assert bucketed < 0.25 * math.log(2)


def test_greedy_agreement_counts_the_positions_where_both_pick_the_same_token():
    # The trial differs from the reference only after token 2: two of the six predicted positions.
    trial = BigramModel([P, P, Q])
    reference = compute_reference(same_for_every_token(P), WINDOWS, top_k=3)
    quality = compare_with_reference(trial, reference)
    assert quality["top1_agreement"] == pytest.approx(4 / 6)
    assert quality["kl_divergence"] == pytest.approx(2 / 6 * 0.25 * math.log(2))


def test_nan_logits_are_broken_output():
    reference = compute_reference(same_for_every_token(P), WINDOWS, top_k=3)
    broken = same_for_every_token(P)
    with torch.no_grad():
        broken.table.weight[2, 0] = float("nan")
    with pytest.raises(BrokenOutputError, match="NaN or infinite logits"):
        compare_with_reference(broken, reference)


def test_a_saved_reference_loads_back_the_same(tmp_path):
    reference = compute_reference(same_for_every_token(P), WINDOWS, top_k=2)
    path = tmp_path / "references" / "ref.pt"
    save_reference(reference, path)
    loaded = load_reference(path)
    assert loaded["perplexity"] == reference["perplexity"]
    for key in ("windows", "top_logp", "top_idx"):
        assert torch.equal(loaded[key], reference[key])
    assert [file.name for file in path.parent.iterdir()] == ["ref.pt"]  # no staging file left behind
