"""Tier 0: the share of a trial's free-running generations that are degenerate (empty, one token, a repetition loop,
or run to the limit where the reference stopped), each where the reference's own row is not.

A trial's timed generate() is given an end-of-sequence id no model produces (worker/generation.py), so every row runs
to the workload's length; each greedy token depends only on the tokens before it, so a row cut at the model's first
real end-of-sequence token is what generate() with that id would have returned. The reference's greedy rows are cut
the same way. No generation is run for it.
"""

from __future__ import annotations

from typing import Any

from autotune.figures.metrics import DEGENERATE_SHARE, GENERATIONS_JUDGED

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
