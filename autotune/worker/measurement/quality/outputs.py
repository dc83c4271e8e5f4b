"""A trial's timed outputs against the reference's greedy continuations: the share of each it reproduced before
diverging (greedy agreement), and whether they are unusable (broken: empty, or one token repeated throughout where
the reference does not repeat it)."""

from __future__ import annotations


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
