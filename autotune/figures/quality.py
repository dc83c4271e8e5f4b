"""Where a trial's quality figures came from: the path its KL, top-1, perplexity and agreements were measured on.

The worker names the path with each trial (TaskDetails.quality_path); readers say it beside the figures wherever
it is not the trial's own decoding path, so that figures of different paths never pass as equal.
"""

from __future__ import annotations

from collections.abc import Iterable

from autotune.figures.metrics import REPORTED, Metric

DECODE = "decode"  # teacher-forced through the trial's own generate(): its cache, compiled step, speculative method
GENERATE = "generate"  # the same model and settings through generate(): continuous batching exposes no logits
SERVED = "served"  # the served configuration loaded in the trial and run through generate(): the server shows none
PREFILL = "prefill"  # one forward pass over the text, no cache, no compiled step: studies before 2026-11-27

PATHS: dict[str, str] = {
    DECODE: "through the trial's own decoding path (its cache, compiled step, batching and speculative method)",
    GENERATE: (
        "through generate()'s decoding with the same model and settings: continuous batching exposes no logits; "
        "greedy agreement is of its own outputs"
    ),
    SERVED: (
        "through generate()'s decoding of the served configuration, loaded in the trial: the server exposes no logits"
    ),
    PREFILL: (
        "on the prefill path: one forward pass over the text, with no cache and no compiled step (a study written "
        "before 2026-11-27): a quantized cache, compilation or batching could not move these figures"
    ),
}

EVERY_TRIAL_DECODED = (
    "KL, top-1, perplexity and token agreement teacher-forced through each trial's own decoding path (its cache, "
    "compiled step, batching and speculative method); greedy agreement of its own outputs"
)

# Figures that depend on the path: those of the teacher-forced comparisons (each says so: Metric.on_path). Greedy
# agreement is always of the trial's own timed outputs.
ON_THE_PATH: frozenset[str] = frozenset(metric.name for metric in REPORTED if metric.on_path)


def stored_path(stored: str | None) -> str:
    """The path a stored trial names; a trial that names none was measured before paths were named: the prefill."""
    return stored if stored in PATHS else PREFILL


def path_note(path: str) -> str:
    """What a reader is told beside the figures; nothing for a trial's own decoding path."""
    return "" if path == DECODE else f"quality measured {PATHS[path]}"


def depends_on_path(metric: Metric) -> bool:
    return metric.name in ON_THE_PATH


def path_lines(trials: Iterable[tuple[int, str]]) -> list[str]:
    """For (trial number, path) pairs: which trials' quality did not come from their own decoding path, and whence."""
    by_path: dict[str, list[str]] = {}
    for number, path in trials:
        if path != DECODE:
            by_path.setdefault(path, []).append(f"#{number}")
    return [f"{', '.join(numbers)}: {path_note(path)}" for path, numbers in sorted(by_path.items())]
