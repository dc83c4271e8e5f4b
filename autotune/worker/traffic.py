"""A trace's replayed requests made into token ids with the model's tokenizer, the same on every machine.

Text is tokenized; token ids are taken as they are; a count of tokens gets that many tokens of the bundled corpus,
each request's own (a marker of three tokens, then the corpus from a place of its own), and blocks named by hash ids
get tokens of their own per id, so that requests sharing an id share those tokens and no others do. A
conversation's turn is the turn before it (its input and its recorded reply, or corpus tokens as long as its
output where the trace records none) followed by its own input: the earlier turn is a prefix of it, token for token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.data import CORPUS
from autotune.traffic import BLOCK_TOKENS, TraceRequest, TrafficRef, read_window, turns
from autotune.traffic.shape import TrafficShape

MARKER_TOKENS = 3  # tokens that make a request's or a block's corpus tokens its own
FIRST_MARKER_ID = 4  # below: the special tokens most tokenizers number first (pad, bos, eos, unk)
CORPUS_STRIDE = 997  # tokens between two requests' starting places in the corpus (prime: few coincide)


@dataclass(frozen=True)
class ReplayRequest:
    """One request as a trial sends it: its input ids, the tokens it asks for, its arrival, and how many leading tokens
    of its input an earlier request had (a prefix a cache could reuse)."""

    ids: list[int]
    output_len: int
    arrival_s: float | None
    reusable: int
    previous: int | None = None  # the index of the same conversation's turn before it


class Tokens:
    """The tokenizer, and the bundled corpus's tokens the requests without text are made of."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.corpus: list[int] = tokenizer(CORPUS.read_text(), add_special_tokens=False)["input_ids"]
        self.vocab = len(tokenizer)

    def text(self, text: str, first: bool) -> list[int]:
        """Text as the model reads it: special tokens (a BOS) only at the start of a conversation."""
        return list(self.tokenizer(text, add_special_tokens=first)["input_ids"])

    def own(self, count: int, number: int) -> list[int]:
        """`count` tokens no other request or block has: a marker made of `number`, then the corpus."""
        marker = self._marker(number)
        start = (number * CORPUS_STRIDE) % len(self.corpus)
        body = (self.corpus * (count // len(self.corpus) + 2))[start : start + max(0, count - len(marker))]
        return (marker + body)[:count]

    def _marker(self, number: int) -> list[int]:
        span = self.vocab - FIRST_MARKER_ID
        return [FIRST_MARKER_ID + (number // span**digit) % span for digit in range(MARKER_TOKENS)]


def replay_requests(traffic: TrafficRef, cache_dir: Path, tokenizer: Any) -> list[ReplayRequest]:
    """The window of the study's trace this machine keeps, as token ids."""
    path = traffic.window_path(cache_dir)
    if not path.exists():
        raise FileNotFoundError(f"the study's traffic ({traffic.describe()}) is not at {path}")
    return materialize(read_window(path), Tokens(tokenizer))


def materialize(requests: list[TraceRequest], tokens: Tokens) -> list[ReplayRequest]:
    inputs: list[list[int]] = []
    replies: list[list[int]] = []
    replayed: list[ReplayRequest] = []
    seen_blocks: set[tuple[int, ...]] = set()
    for index, (request, previous) in enumerate(zip(requests, turns(requests), strict=True)):
        history = [] if previous is None else inputs[previous] + replies[previous]
        own = _own_input(request, index, tokens, first=previous is None)
        ids = history + own
        reply = tokens.text(request.reply, first=False) if request.reply else []
        output_len = request.output_tokens or len(reply)
        if not reply:  # the next turn's history: the recorded reply, else tokens of the output's length
            reply = tokens.own(output_len, len(requests) + index)
        earlier_turn = len(inputs[previous]) if previous is not None else 0
        reusable = max(earlier_turn, _shared_blocks(request, seen_blocks))
        inputs.append(ids)
        replies.append(reply)
        replayed.append(ReplayRequest(ids, output_len, request.arrival_s, min(reusable, len(ids)), previous))
    return replayed


def _own_input(request: TraceRequest, index: int, tokens: Tokens, first: bool) -> list[int]:
    if request.prompt is not None:
        return tokens.text(request.prompt, first)
    if request.prompt_ids is not None:
        return list(request.prompt_ids)
    count = request.input_tokens or 0
    blocks = [tokens.own(BLOCK_TOKENS, 2**20 + block) for block in request.hash_ids]
    ids = [token for block in blocks for token in block][:count]
    return ids + tokens.own(count - len(ids), index) if len(ids) < count else ids


def _shared_blocks(request: TraceRequest, seen: set[tuple[int, ...]]) -> int:
    """Tokens of the request's leading blocks an earlier request had the same leading blocks of (its hash ids)."""
    shared = 0
    for end in range(1, len(request.hash_ids) + 1):
        prefix = request.hash_ids[:end]
        if prefix in seen:
            shared = end * BLOCK_TOKENS
        seen.add(prefix)
    return min(shared, request.input_tokens or 0)


def shape_of(requests: list[ReplayRequest]) -> TrafficShape:
    timed = all(request.arrival_s is not None for request in requests)
    return TrafficShape(
        tuple(len(request.ids) for request in requests),
        tuple(request.output_len for request in requests),
        tuple(request.reusable for request in requests),
        tuple(float(request.arrival_s or 0.0) for request in requests) if timed else None,
    )
