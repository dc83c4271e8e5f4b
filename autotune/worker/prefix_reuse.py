"""prefix_reuse: a prefix requests share computed once. generate() keeps a prompt cache per conversation when asked
(prefix_reuse=on: the knob's worker hook, space/knobs/batching.py); continuous batching shares a prefix's full pages
itself, which `PrefixHits` counts.

A conversation's next turn begins with the turn before it: its input, then the reply. The cache generate() leaves
holds that input and what this configuration generated, not the trace's recorded reply, so it is cut back to the
input, and the next turn prefills only the rest.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class PromptCaches:
    """generate()'s cache of each request's input, kept until the same conversation's next turn takes it."""

    def __init__(self) -> None:
        self.kept: dict[
            int, tuple[Any, int]
        ] = {}  # request index -> (its cache, cut to its input; that input's length)

    def take(self, previous: int | None) -> tuple[Any | None, int]:
        """The cache the conversation's turn before this one left, and how many tokens of input it holds; (None, 0)
        for a first turn."""
        if previous is None or previous not in self.kept:
            return None, 0
        return self.kept.pop(previous)

    def keep(self, index: int, cache: Any, input_len: int) -> None:
        """The cache a request's generate() left, cut to its input (the next turn's history has the trace's reply)."""
        beyond = cache.get_seq_length() - input_len
        if beyond > 0:
            cache.crop(-beyond)  # a negative count removes that many tokens (transformers 5.17 and 5.22 alike)
        self.kept[index] = (cache, input_len)


class PrefixHits:
    """The prompt tokens continuous batching found already in its cache (its prefix sharing), counted while it runs.

    transformers counts none it says outside its logs: its paged cache's `search_prefix_match` (5.17 to 5.23) is
    wrapped for the trial's process, and unwrapped by `close`. Where it has no such method, nothing is counted (None).
    """

    def __init__(self) -> None:
        from transformers.generation.continuous_batching import cache

        self.owner = getattr(cache, "PagedAttentionCache", None)
        self.original = getattr(self.owner, "search_prefix_match", None)
        self.tokens = 0
        if self.original is None:
            log.warning("this transformers' continuous batching has no search_prefix_match: prefix hits not counted")
            return
        original, hits = self.original, self

        def counted(cache_self: Any, request_id: str, prompt_ids: list[int]) -> int:
            found = original(cache_self, request_id, prompt_ids)
            hits.tokens += min(found, max(0, len(prompt_ids) - 1))  # at least one token is always prefilled
            return found

        self.owner.search_prefix_match = counted  # type: ignore[union-attr]

    @property
    def counting(self) -> bool:
        return self.original is not None

    def close(self) -> None:
        if self.original is not None:
            self.owner.search_prefix_match = self.original  # type: ignore[union-attr]
