"""Quality against the reference (autotune.worker.measurement.quality), on a bigram model whose distributions are known.

A bigram model's next-token distribution depends on the current token only, so every KL, agreement and perplexity
below is worked out by hand from the three-token distributions written here. The bigram decodes in a greedy loop of
its own that calls the logits processor as generate() does, once per step with the tokens so far; the same code
runs through generate() itself in tests/worker/test_measurement.py and tests/e2e/test_quality_path.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from autotune.worker.failures import BrokenOutputError
from autotune.worker.measurement.quality.forced import ForcedRows, layout, reference_rows, trial_figures
from autotune.worker.measurement.quality.reference import compute_reference, load_reference, save_reference

P = [0.5, 0.25, 0.25]  # the reference's next-token distribution
Q = [0.25, 0.5, 0.25]  # a trial's: KL(P || Q) = 0.5 ln 2 + 0.25 ln 0.5 = 0.25 ln 2
# One row of text: the prompt is token 0; six decoded positions, forced to 1, 2, 0, 2, 1, 0.
TEXT = ForcedRows(torch.tensor([[0]]), torch.tensor([[1, 2, 0, 2, 1, 0]]))
PROMPTS = torch.tensor([[0]])  # the workload's one prompt; with P, the reference's greedy continuation is all 0s
POSITIONS = 6  # one row of text and one prompt, at batch 1
CPU = torch.device("cpu")


class BigramModel:
    """logits of the next token = log(distributions[current token])."""

    def __init__(self, distributions: list[list[float]]) -> None:
        self.table = torch.tensor(distributions).log()

    def decode(self, prompts: torch.Tensor, processor: Callable, steps: int, draft: bool = False) -> torch.Tensor:
        """Greedy decoding, as generate() runs it: at each step the processor sees the tokens so far and the raw
        logits. `draft`: first call it with a draft's garbage logits for the same position, as speculative decoding
        does before the main model verifies it."""
        ids = prompts
        for _ in range(steps):
            if draft:
                processor(ids, torch.zeros(ids.shape[0], 3))
            scores = processor(ids, self.table[ids[:, -1]].clone())
            ids = torch.cat([ids, scores.argmax(dim=-1, keepdim=True)], dim=1)
        return ids[:, prompts.shape[1] :]

    def run(self, steps: int = 6, draft: bool = False) -> Callable[[torch.Tensor, Callable], torch.Tensor]:
        return lambda prompts, processor: self.decode(prompts, processor, steps, draft)


def same_for_every_token(distribution: list[float]) -> BigramModel:
    return BigramModel([distribution] * 3)


def reference_of(model: BigramModel, top_k: int = 3) -> dict:
    return compute_reference(model.run(), 1, TEXT, CPU, top_k, POSITIONS)


def figures(trial: BigramModel, reference: dict, greedy: list[int] | None = None, **run: bool) -> dict[str, float]:
    prompts = ForcedRows(PROMPTS, torch.tensor([greedy or [0] * 6]))
    return trial_figures(trial.run(**run), trial.run(**run), reference, prompts, padded=False, device=CPU)


def test_the_reference_against_itself_has_no_divergence_full_agreement_and_its_own_perplexity():
    model = same_for_every_token(P)
    reference = reference_of(model)
    # targets 1, 2, 0, 2, 1, 0: four at probability 1/4, two at 1/2 -> mean NLL (10/6) ln 2
    assert reference["perplexity"] == pytest.approx(2 ** (5 / 3))
    quality = figures(model, reference)
    assert quality["kl_divergence"] == pytest.approx(0.0, abs=1e-7)
    assert quality["top1_agreement"] == 1.0 and quality["token_agreement"] == 1.0
    assert quality["perplexity_delta"] == pytest.approx(0.0, abs=1e-6)


def test_kl_of_known_distributions_is_the_hand_computed_value_when_top_k_covers_the_vocabulary():
    quality = figures(same_for_every_token(Q), reference_of(same_for_every_token(P)))
    assert quality["kl_divergence"] == pytest.approx(0.25 * math.log(2))
    assert quality["top1_agreement"] == 0.0  # the reference puts token 0 first, the trial token 1
    assert quality["token_agreement"] == 0.0  # along the reference's greedy 0s, the trial picks 1 every time
    # the trial gives targets 1, 2, 0, 2, 1, 0 probabilities 1/2, 1/4, 1/4, 1/4, 1/2, 1/4: mean NLL (10/6) ln 2
    assert quality["perplexity"] == pytest.approx(2 ** (5 / 3))


def test_with_fewer_top_tokens_the_rest_is_one_bucket_and_the_kl_a_lower_bound():
    quality = figures(same_for_every_token(Q), reference_of(same_for_every_token(P), top_k=1))
    # token 0: 0.5 ln(0.5 / 0.25); the rest: 0.5 ln(0.5 / 0.75)
    bucketed = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    assert quality["kl_divergence"] == pytest.approx(bucketed)
    assert bucketed < 0.25 * math.log(2)


def test_each_position_is_judged_after_the_forced_prefix_so_one_difference_costs_only_its_positions():
    # The trial differs from the reference only after token 2: two of the six forced positions of the text. Along the
    # reference's greedy continuation (0s) it never sees token 2, so it agrees at every position.
    trial = BigramModel([P, P, Q])
    quality = figures(trial, reference_of(same_for_every_token(P)))
    assert quality["top1_agreement"] == pytest.approx(4 / 6)
    assert quality["kl_divergence"] == pytest.approx(2 / 6 * 0.25 * math.log(2))
    assert quality["token_agreement"] == 1.0
    # forced along 0, 0, 2, 2, 0, 0 instead: after 0 it puts 0 first (positions 1, 2, 3 and 6: targets 0, 0, 2, 0,
    # three agree), after 2 token 1 (positions 4 and 5: targets 2 and 0, none agree): 3 of 6
    along = figures(trial, reference_of(same_for_every_token(P)), greedy=[0, 0, 2, 2, 0, 0])
    assert along["token_agreement"] == pytest.approx(3 / 6)


def test_a_position_called_twice_is_judged_by_its_last_call_the_main_models_verification():
    reference = reference_of(same_for_every_token(P))
    assert figures(same_for_every_token(Q), reference, draft=True) == figures(same_for_every_token(Q), reference)


def test_a_path_that_ignores_the_forced_tokens_is_an_error_not_a_figure():
    model = same_for_every_token(P)
    reference = reference_of(model)

    def ignoring(prompts: torch.Tensor, processor: Callable) -> torch.Tensor:
        model.decode(prompts, processor, 6)  # the processor sees every position, but its scores are not used
        return torch.zeros(prompts.shape[0], 6, dtype=torch.long)

    prompts = ForcedRows(PROMPTS, torch.tensor([[0] * 6]))
    with pytest.raises(RuntimeError, match="did not follow the forced tokens"):
        trial_figures(ignoring, ignoring, reference, prompts, padded=False, device=CPU)


def test_nan_logits_are_broken_output():
    reference = reference_of(same_for_every_token(P))
    broken = same_for_every_token(P)
    broken.table[2, 0] = float("nan")
    with pytest.raises(BrokenOutputError, match="NaN or infinite logits"):
        figures(broken, reference)


@pytest.mark.parametrize(
    ("batch", "forced", "text_rows", "prompt_rows", "calls"),
    [
        (8, 64, 4, 4, 1),
        (64, 64, 4, 60, 1),
        (2, 64, 4, 2, 3),
        (3, 64, 6, 3, 3),
        (4, 64, 4, 4, 2),
        (16, 64, 4, 12, 1),
        (1, 64, 3, 1, 4),  # at most 4 generations: 192 positions of text
        (1, 4, 3, 1, 4),  # a test's 4 tokens out: 12 positions, not 64 generations
        (8, 4, 24, 8, 4),
    ],
)
def test_a_batch_judges_up_to_256_positions_of_text_and_of_prompts_in_at_most_4_generations_of_its_size(
    batch, forced, text_rows, prompt_rows, calls
):
    judged = layout(batch, forced_len=forced, positions=256)
    assert (judged.eval_count, judged.token_count, judged.calls) == (text_rows, prompt_rows, calls)
    assert judged.eval_count + judged.token_count == calls * batch  # every generation is of the timed batch


def test_the_reference_decodes_the_rows_any_batch_judges_alone_or_packed():
    assert reference_rows({1, 8}, 64, 256) == 8  # batch 8 with padded prompts: 8 rows of text alone
    assert reference_rows({1}, 64, 256) == 3
    assert reference_rows({1, 3}, 64, 256) == 6


def test_padded_prompts_run_apart_from_the_text_in_whole_batches():
    model = same_for_every_token(P)
    reference = compute_reference(
        model.run(), 1, ForcedRows(TEXT.prompts.repeat(2, 1), TEXT.targets.repeat(2, 1)), CPU, 3, 6
    )
    calls: list[int] = []

    def counted(prompts: torch.Tensor, processor: Callable) -> torch.Tensor:
        calls.append(prompts.shape[0])
        return model.decode(prompts, processor, 6)

    prompts = ForcedRows(PROMPTS.repeat(2, 1), torch.zeros(2, 6, dtype=torch.long))
    quality = trial_figures(counted, counted, reference, prompts, padded=True, device=CPU)
    assert calls == [2, 2]  # the text's two rows, then the two prompts: each a generation of the timed batch
    assert quality["kl_divergence"] == pytest.approx(0.0, abs=1e-7) and quality["token_agreement"] == 1.0


def test_a_saved_reference_loads_back_the_same(tmp_path):
    reference = reference_of(same_for_every_token(P), top_k=2)
    path = tmp_path / "references" / "ref.pt"
    save_reference(reference, path)
    loaded = load_reference(path)
    assert loaded["perplexity"] == reference["perplexity"] and loaded["positions"] == POSITIONS
    for key in ("prompts", "targets", "top_logp", "top_idx"):
        assert torch.equal(loaded[key], reference[key])
    assert [file.name for file in path.parent.iterdir()] == ["ref.pt"]  # no staging file left behind
